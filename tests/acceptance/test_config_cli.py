"""``receiver serve --config examples/receiver.toml`` as a person would run it: secrets in the
environment, a real server process, a signed delivery and its replay; then ``ttl``, ``sweep``,
``migrate`` and ``inspect`` on the same file, and a broken file refused before uvicorn starts."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest

from receiver import generate_secret, sign_github
from tests.pgcluster import free_port
from tests.servers import RECEIVER, ROOT

EXAMPLE = str(ROOT / "examples" / "receiver.toml")
GITHUB_SECRET = "it's a secret to everybody"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env["PYTHONPATH"] = str(ROOT)  # the example's handler module, as in a clone
    return {**env, **extra}


def receiver(*args: str, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RECEIVER, *args],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextmanager
def serving(*args: str, cwd: Path, env: Mapping[str, str]) -> Iterator[str]:
    """``receiver serve ARGS`` on a free port; yields its URL, stops it with SIGTERM."""
    port = free_port()
    log = cwd / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [RECEIVER, "serve", *args, "--port", str(port), "--log-level", "warning"],
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                httpx.get(url, timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def github_delivery(url: str, delivery: str) -> httpx.Response:
    body = orjson.dumps({"action": "opened", "issue": {"number": 1}})
    headers = {
        "content-type": "application/json",
        "x-github-delivery": delivery,
        "x-github-event": "issues",
        "x-hub-signature-256": sign_github(GITHUB_SECRET, body),
    }
    return httpx.post(f"{url}/github", content=body, headers=headers, timeout=30)


@pytest.mark.slow
def test_serve_the_example_file_send_and_replay(tmp_path: Path) -> None:
    secret = generate_secret()
    env = clean_env(DEMO_SECRET=secret, GITHUB_WEBHOOK_SECRET=GITHUB_SECRET)
    send = ["send", "--secret", secret, "--id", "msg_cfg_1"]

    with serving("--config", EXAMPLE, cwd=tmp_path, env=env) as url:
        first = receiver(*send, "--url", f"{url}/demo", cwd=tmp_path, env=env)
        second = receiver(*send, "--url", f"{url}/demo", cwd=tmp_path, env=env)
        assert first.returncode == 0, first.stderr
        assert "HTTP 200" in first.stdout
        assert "idempotent-replayed" not in first.stdout
        assert "HTTP 200" in second.stdout
        assert "idempotent-replayed: true" in second.stdout
        assert first.stdout.splitlines()[-1] == second.stdout.splitlines()[-1]
        assert first.stdout.splitlines()[-1] == '{"order_id":"o-cfg_1","status":"created"}'

        # The second provider of the file, with its own scheme and secret.
        issue = github_delivery(url, "gh-1")
        again = github_delivery(url, "gh-1")
        assert (issue.status_code, issue.json()) == (200, {"status": "ignored"})
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == issue.content

        forged = receiver(
            "send", "--url", f"{url}/demo", "--secret", generate_secret(), cwd=tmp_path, env=env
        )
        assert "HTTP 401" in forged.stdout

    # The file's store, relative to the working directory like --store's.
    assert (tmp_path / "receiver.db").exists()
    shown = receiver(
        "inspect", "demo", "msg_cfg_1", "--store", "sqlite:///receiver.db", cwd=tmp_path, env=env
    )
    assert "state        completed (fence 1)" in shown.stdout, shown.stderr

    swept = receiver("sweep", "--config", EXAMPLE, cwd=tmp_path, env=env)
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.startswith("recovered 0, failed 0")


@pytest.mark.slow
def test_receiver_config_env_with_workers_and_a_store_override(tmp_path: Path) -> None:
    secret = generate_secret()
    env = clean_env(
        DEMO_SECRET=secret,
        GITHUB_WEBHOOK_SECRET=GITHUB_SECRET,
        RECEIVER_CONFIG=EXAMPLE,
        RECEIVER_STORE="sqlite:///override.db",
    )
    send = ["send", "--secret", secret, "--id", "msg_cfg_2"]
    # Two workers: each process builds its Receiver from the file (uvicorn's factory).
    with serving("--workers", "2", cwd=tmp_path, env=env) as url:
        first = receiver(*send, "--url", f"{url}/demo", cwd=tmp_path, env=env)
        second = receiver(*send, "--url", f"{url}/demo", cwd=tmp_path, env=env)
    assert "HTTP 200" in first.stdout, first.stdout + first.stderr
    assert "idempotent-replayed" not in first.stdout
    assert "idempotent-replayed: true" in second.stdout
    swept = receiver("sweep", cwd=tmp_path, env=env)  # the same environment: the same store
    assert swept.returncode == 0, swept.stderr
    assert (tmp_path / "override.db").exists()
    assert not (tmp_path / "receiver.db").exists()


def test_ttl_and_migrate_need_no_secrets(tmp_path: Path) -> None:
    env = clean_env()  # neither DEMO_SECRET nor GITHUB_WEBHOOK_SECRET
    shown = receiver("ttl", "--config", EXAMPLE, cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    header, demo, github = shown.stdout.splitlines()
    assert header.split() == ["provider", "schedule", "span", "margin", "window", "source"]
    assert demo.split()[:9] == ["demo", "svix", "(8", "attempts)", "27h", "35m", "5s", "1d", "52h"]
    assert github.split()[:7] == ["github", "github", "(2", "attempts)", "3d", "1d", "4d"]

    migrated = receiver("migrate", "--config", EXAMPLE, cwd=tmp_path, env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.splitlines()[-1] == "schema ready in sqlite:///receiver.db"
    assert "applied 0001_initial" in migrated.stdout


def test_a_broken_file_is_refused_before_serving(tmp_path: Path) -> None:
    config = tmp_path / "receiver.toml"
    config.write_text('[providers.demo]\nsecrets_env = ["DEMO_SECRET"]\nshedule = "svix"\n')
    env = clean_env(DEMO_SECRET=generate_secret())
    done = receiver("serve", "--config", str(config), cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"receiver: {config}:3: providers.demo.shedule: unknown key (did you mean schedule?); "
        "a provider takes scheme, secrets_env, tolerance, schedule, review_margin, ttl, lease, "
        "mode, retry_attempts, retry_base, retry_cap, dedup_key, url, timeout, shed_status, "
        "handoff, same_content"
    )

    missing = receiver("serve", "--config", EXAMPLE, cwd=tmp_path, env=clean_env())
    assert missing.returncode == 2
    lines = Path(EXAMPLE).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.startswith("secrets_env"))
    assert missing.stderr.strip() == (
        f"receiver: {EXAMPLE}:{line}: providers.demo.secrets_env[0]: environment variable "
        "DEMO_SECRET is not set; export it with the provider's secret (secrets are never read "
        "from the file)"
    )

    both = receiver("serve", "--config", EXAMPLE, "--app", "handlers:rx", cwd=tmp_path, env=env)
    assert both.returncode == 2
    assert "--config and --app handlers:rx (or RECEIVER_APP) both say what to run" in both.stderr
