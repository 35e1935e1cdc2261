"""tools/uv_env.py: ``make setup`` hands pip's settings to uv (find-links, indexes, constraints)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("uv_env", Path(__file__).resolve().parents[1] / "tools" / "uv_env.py")
uv_env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_env)

LISTING = """global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
:env:.find-links='/srv/wheels'
"""


def test_pip_settings_become_uv_variables_the_environment_scope_last():
    settings = uv_env.pip_settings(LISTING)
    assert settings["find-links"] == "/srv/wheels"  # PIP_FIND_LINKS, listed after the files, wins
    lines = uv_env.uv_exports(settings, environ={})
    assert "export UV_FIND_LINKS=/srv/wheels" in lines
    assert "export UV_EXTRA_INDEX_URL='file:///opt/pypi/simple file:///opt/pypi-more/simple'" in lines
    assert "export UV_CONSTRAINT=/etc/xdg/pip/constraints.txt" in lines
    assert "export SSL_CERT_FILE=/etc/ssl/certs/ca.crt" in lines
    assert lines[-1] == "export UV_INDEX_STRATEGY=unsafe-best-match"


def test_a_uv_variable_the_user_exported_wins_and_no_settings_give_only_the_strategy():
    lines = uv_env.uv_exports(uv_env.pip_settings(LISTING), environ={"UV_FIND_LINKS": "/mine", "UV_INDEX_STRATEGY": "first-index"})
    assert not [ln for ln in lines if "UV_FIND_LINKS" in ln or "UV_INDEX_STRATEGY" in ln]
    assert uv_env.uv_exports(uv_env.pip_settings(""), environ={}) == ["export UV_INDEX_STRATEGY=unsafe-best-match"]
