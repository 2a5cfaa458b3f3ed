"""``receiver send --scheme``: a delivery of each built-in sender, signed and shaped by the same
table as the testing kit's, verifies against a real ``receiver serve`` configured with that
scheme, and the same --id sent again replays."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from receiver import generate_secret
from receiver._verification.sending import SCHEMES
from tests.pgcluster import free_port
from tests.servers import RECEIVER

pytestmark = pytest.mark.slow

#: The secret each provider is configured with, in the form that sender's secrets take.
SECRETS = {name: "shared-secret-of-" + name for name in SCHEMES}
SECRETS["standard-webhooks"] = SECRETS["svix"] = generate_secret()
SECRETS["stripe"] = "whsec_stripe_endpoint_secret"
SECRETS["twilio"] = "twilio-auth-token-0123456789abcdef"
TYPES = {name: "order.created" for name in SCHEMES}
TYPES["twilio"] = "message.delivered"
TYPES["slack"] = "message"

HANDLERS = """\
from receiver import Event


def register(rx):
    for provider, event_type in {types!r}.items():
        @rx.on(event_type, provider=provider)
        async def handle(event: Event, tx) -> dict:
            return {{"provider": event.provider, "id": event.id}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> object:
    project = tmp_path_factory.mktemp("send")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (project / "sendhandlers.py").write_text(HANDLERS.format(types=TYPES))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    env["PYTHONPATH"] = f"{project}{os.pathsep}{env.get('PYTHONPATH', '')}"
    text = ['store = "sqlite:///send.db"', 'handlers = ["sendhandlers"]']
    for index, name in enumerate(SCHEMES):
        env[f"SECRET_{index}"] = SECRETS[name]
        # Svix sends Standard Webhooks under its own header names: the same verifier.
        configured = "standard-webhooks" if name == "svix" else name
        text += [f'[providers."{name}"]', f'scheme = "{configured}"']
        text += [f'secrets_env = ["SECRET_{index}"]']
        if name == "twilio":
            text += [f'url = "{base}/twilio"']  # Twilio signs the URL it requests
    (project / "receiver.toml").write_text("\n".join(text) + "\n")
    log = (project / "serve.log").open("w+")
    process = subprocess.Popen(
        [RECEIVER, "serve", "--config", "receiver.toml", "--port", str(port)],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/", timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, Path(log.name).read_text()
                assert process.poll() is None, Path(log.name).read_text()
                time.sleep(0.1)
        yield base, env
    finally:
        process.terminate()
        process.wait(timeout=10)


def send(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RECEIVER, "send", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_schemes_delivery_verifies_and_replays(
    server: tuple[str, dict[str, str]], scheme: str
) -> None:
    base, env = server
    line = ["--scheme", scheme, "--url", f"{base}/{scheme}", "--secret", SECRETS[scheme]]
    line += ["--type", TYPES[scheme], "--id", f"id-{scheme}-1"]
    first, again = send(env, *line), send(env, *line)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "HTTP 200" in first.stdout
    assert "idempotent-replayed" not in first.stdout
    assert "idempotent-replayed: true" in again.stdout, again.stdout
    assert first.stdout.splitlines()[-1] == again.stdout.splitlines()[-1]
    other = send(env, *line[:-1], f"id-{scheme}-2")
    assert "HTTP 200" in other.stdout
    assert "idempotent-replayed" not in other.stdout  # another id: another event
    forged = send(env, *line[:4], "--secret", "whsec_" + "A" * 32, *line[6:])
    assert "HTTP 401" in forged.stdout, forged.stdout
