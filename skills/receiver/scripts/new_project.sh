#!/usr/bin/env bash
# Write a receiver project into DIR (receiver init) and run its three tests; exits non-zero if
# any fails. Usage: new_project.sh DIR [--tool]
set -euo pipefail
dir="${1:?usage: new_project.sh DIR [--tool]}"
shift
receiver init "$dir" "$@"
cd "$dir"
python -m pytest -q -p no:cacheprovider
