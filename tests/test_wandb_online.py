"""W&B online (issue 55 item 3): pre-flight checks the key before Ray starts, and a W&B that cannot
be reached turns the run offline in one line instead of failing it after minutes of retries.

Only loopback addresses: W&B's base URL is a free port where nothing listens, a socket that accepts
and never answers, or a tiny HTTP server on 127.0.0.1 answering 401 (or 200) to every request.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grpo_dist.config import ConfigError, dump_config, load_config
from grpo_dist.run.monitor import wandb_check
from grpo_dist.util.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
GOOD_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 hex characters: well formed
SHORT_KEY = "0123456789abcdef0123456789abcdef0123"  # 36: a key cut short when pasted


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """No key from this machine's own login: WANDB_API_KEY unset, netrc a file of the test's."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    wandb_check.forget()
    yield monkeypatch
    wandb_check.forget()


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 401

    def _answer(self):
        body = json.dumps({"errors": [{"message": "user is not logged in"}]} if self.status == 401 else
                          {"data": {"viewer": {"id": "VXNlcjox", "entity": "me"}}}).encode()
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    """A loopback HTTP server answering ``status`` to every request: ``start(status)`` -> its URL."""
    running = []

    def start(status: int) -> str:
        handler = type("Handler", (_Answer,), {"status": status})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.seen = []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        running.append(srv)
        start.seen = srv.seen  # (method, path, Authorization) of each request, in order
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in running:
        srv.shutdown()
        srv.server_close()


def _logging(mode: str = "online"):
    return load_config(None, ["--logging.wandb_mode", mode]).logging


# ------------------------------------------------------------------------------- the key's form

@pytest.mark.parametrize("key", [GOOD_KEY, "local-" + GOOD_KEY, "x" * 40, "a" * 86, "abc-" + "A_b" * 14, SHORT_KEY,
                                 "", "local-" + SHORT_KEY, GOOD_KEY[:-1] + "!", "eyJh.eyJz.c2ln", "k" * 39 + " "])
def test_the_key_format_is_the_installed_wandbs(key):
    """The format check pre-flight runs without importing wandb agrees with wandb's own
    (wandb/sdk/lib/wbauth/validation.py): a wandb that changes its rule fails here first."""
    from wandb.sdk.lib.wbauth.validation import check_api_key

    assert (wandb_check.key_problem(key) is None) == (check_api_key(key.strip()) is None and key == key.strip())


def test_a_malformed_key_stops_at_preflight_naming_its_source(wandb_env):
    wandb_env.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")  # never asked: the form is wrong
    wandb_env.setenv("WANDB_API_KEY", SHORT_KEY)
    with pytest.raises(ConfigError) as e:
        wandb_check.wandb_mode(_logging(), say=print)
    line = str(e.value)
    assert line.startswith("logging.wandb_mode: online, but WANDB_API_KEY is not a W&B API key: ")
    assert "has 36" in line and SHORT_KEY not in line and "\n" not in line


def test_a_key_from_wandb_login_is_read_from_netrc(wandb_env, server, tmp_path):
    """No WANDB_API_KEY: the key `wandb login` wrote for the server's host (netrc), as wandb reads it."""
    url = server(401)
    host = url.split("//", 1)[1]
    (tmp_path / "netrc").write_text(f"machine {host}\n  login user\n  password {SHORT_KEY}\n")
    wandb_env.setenv("WANDB_BASE_URL", url)
    with pytest.raises(ConfigError, match=r"the key for 127\.0\.0\.1:\d+ in .*netrc is not a W&B API key"):
        wandb_check.wandb_mode(_logging(), say=print)


def test_no_key_at_all_says_how_to_log_in(wandb_env):
    wandb_env.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match=r"^logging\.wandb_mode: online needs a W&B API key, and none is set: "
                                          r"export WANDB_API_KEY.*`wandb login`"):
        wandb_check.wandb_mode(_logging(), say=print)


# ------------------------------------------------------------------------------- the server's answer

def test_a_key_the_server_refuses_stops_at_preflight(wandb_env, server):
    url = server(401)
    wandb_env.setenv("WANDB_BASE_URL", url)
    wandb_env.setenv("WANDB_API_KEY", GOOD_KEY)
    with pytest.raises(ConfigError) as e:
        wandb_check.wandb_mode(_logging(), say=print)
    assert str(e.value).startswith(f"logging.wandb_mode: online, but W&B at {url} refused the API key from "
                                   f"WANDB_API_KEY (HTTP 401)")
    assert GOOD_KEY not in str(e.value)


def test_a_key_the_server_accepts_logs_online_and_is_asked_once(wandb_env, server):
    url = server(200)
    wandb_env.setenv("WANDB_BASE_URL", url)
    wandb_env.setenv("WANDB_API_KEY", GOOD_KEY)
    said: list[str] = []
    assert wandb_check.wandb_mode(_logging(), say=said.append) == "online"
    assert wandb_check.wandb_mode(_logging(), say=said.append) == "online"  # the monitor's call: decided
    assert said == []
    import base64

    auth = "Basic " + base64.b64encode(f"api:{GOOD_KEY}".encode()).decode()  # as wandb sends the key
    assert server.seen == [("POST", "/graphql", auth)]


@pytest.mark.parametrize("where", ["nothing listens", "never answers"])
def test_unreachable_wandb_goes_offline_in_one_line_within_the_bound(wandb_env, where):
    """The run goes on offline: one line says so, within the probe's bound (a few seconds), and
    the decision holds for the monitor the run makes later (asked once)."""
    silent = None
    if where == "never answers":  # accepts the connection (the kernel's backlog), never reads or answers
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
    else:
        port = free_port()
    url = f"http://127.0.0.1:{port}"
    wandb_env.setenv("WANDB_BASE_URL", url)
    wandb_env.setenv("WANDB_API_KEY", GOOD_KEY)
    said: list[str] = []
    t0 = time.perf_counter()
    try:
        assert wandb_check.wandb_mode(_logging(), say=said.append) == "offline"
    finally:
        if silent is not None:
            silent.close()
    seconds = time.perf_counter() - t0
    assert seconds < wandb_check.PROBE_S + 10, seconds  # bounded (the slack: a loaded machine)
    assert len(said) == 1 and said[0].startswith(f"warning: W&B at {url} cannot be reached (")
    assert "logging offline" in said[0] and "wandb sync" in said[0]
    assert wandb_check.wandb_mode(_logging(), say=said.append) == "offline" and len(said) == 1


def test_offline_and_disabled_ask_nothing(wandb_env):
    wandb_env.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    wandb_env.setenv("WANDB_API_KEY", SHORT_KEY)  # not looked at
    for mode in ("offline", "disabled"):
        assert wandb_check.wandb_mode(_logging(mode), say=print) == mode


@pytest.mark.budget(60)
def test_the_monitor_of_an_unreachable_online_run_writes_offline_files_to_sync(wandb_env, tmp_path):
    """The W&B run of an online config with W&B unreachable: offline files under output_dir/wandb,
    and the summary's `wandb sync` command names them."""
    from grpo_dist.run.monitor import WandbMonitor
    from grpo_dist.run.monitor.wandb_logger import wandb_segments

    wandb_env.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    wandb_env.setenv("WANDB_API_KEY", GOOD_KEY)
    wandb_env.delenv("WANDB_MODE", raising=False)  # (conftest's offline default: the config decides here)
    cfg = load_config(None, ["--output_dir", str(tmp_path), "--logging.wandb_mode", "online",
                             "--logging.project", "grpo_dist-test", "--trainer.run_id", "abc123def456"])
    wb = WandbMonitor.from_config(cfg, config={"x": 1})
    wb.log({"train/loss": 0.5}, step=1)
    run_dir = Path(wb.run_dir)
    wb.close()
    assert wb.mode == "offline" and run_dir.name.startswith("offline-run-") and list(run_dir.glob("*.wandb"))
    seg = wandb_segments(cfg)
    assert seg["wandb_sync"] == f"wandb sync {run_dir}"


# ------------------------------------------------------------------------------- the CLI

def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(extra)
    return env


@pytest.mark.budget(90)
@pytest.mark.parametrize("case", ["malformed", "refused"])
def test_train_with_a_bad_key_exits_2_in_one_line_before_any_actor(case, server, tmp_path, tiny_model_dir):
    url = server(401) if case == "refused" else f"http://127.0.0.1:{free_port()}"
    env = _cli_env(WANDB_BASE_URL=url, WANDB_API_KEY=SHORT_KEY if case == "malformed" else GOOD_KEY,
                   NETRC=str(tmp_path / "netrc"), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    out = tmp_path / "run"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", "configs/tiny_cpu.yaml",
                        "--model.path", str(tiny_model_dir), "--output_dir", str(out), "--logging.wandb_mode",
                        "online"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(f"{case}: exit {r.returncode} in {time.perf_counter() - t0:.1f} s")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in r.stdout + r.stderr, r.stderr
    want = "is not a W&B API key" if case == "malformed" else f"W&B at {url} refused the API key from WANDB_API_KEY"
    assert lines[0].startswith("config error: logging.wandb_mode: online") and want in lines[0], lines[0]
    assert not (out / "workers.log").exists() and not (out / "wandb").exists()  # no Ray, no W&B run started


@pytest.mark.slow
@pytest.mark.budget(400)
def test_a_run_with_wandb_unreachable_finishes_offline(tmp_path, pretrained_model_dir):
    """The new user's run behind a firewall: exit 0, one line saying W&B is unreachable, the run's
    W&B files kept offline and the summary's `wandb sync` command uploading them."""
    import e2e

    cfg = e2e.config(pretrained_model_dir, tmp_path / "run", logging={"wandb_mode": "online", "progress": False})
    (tmp_path / "c.yaml").write_text(dump_config(cfg))
    url = f"http://127.0.0.1:{free_port()}"
    env = _cli_env(WANDB_BASE_URL=url, WANDB_API_KEY=GOOD_KEY, NETRC=str(tmp_path / "netrc"),
                   WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "grpo_dist.cli", "train", "--config", str(tmp_path / "c.yaml")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(f"exit {r.returncode} in {time.perf_counter() - t0:.1f} s")
    assert r.returncode == 0, r.stderr[-3000:]
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "cannot be reached" in ln]
    assert len(said) == 1 and said[0].startswith(f"warning: W&B at {url} cannot be reached"), said
    assert "Traceback" not in r.stdout + r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (run_dir,) = summary["wandb_dirs"]
    assert Path(run_dir).name.startswith("offline-run-") and list(Path(run_dir).glob("*.wandb"))
    assert summary["wandb_sync"] == f"wandb sync {run_dir}"
    assert f"upload: `wandb sync {run_dir}`" in r.stdout
