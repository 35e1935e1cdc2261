"""The documentation site: the generated configuration reference covers every config key, and the
strict build fails on a broken link or anchor (so `make docs`, which `make test` runs, catches one)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def _hook():
    return load_script(ROOT / "docs" / "hooks" / "config_ref.py")


def test_config_reference_has_every_key_with_its_description():
    from grpo_dist.config import Config
    from grpo_dist.config.load import config_keys

    hook = _hook()
    page = hook.render()
    keys = config_keys()
    assert len(keys) > 50
    for key in keys:
        assert f"| `{key}` |" in page, key
    for name, field in Config.model_fields["rollout"].annotation.model_fields.items():
        assert field.description and hook._cell(field.description) in page, name
    assert "| `reward.functions` |" in page and "| `fn` |" in page  # the list entries' own keys
    assert "`rollout.group_size` | integer | `8` |" in page


def _build(tmp_path: Path, extra: str) -> subprocess.CompletedProcess:
    site = tmp_path / "src"
    shutil.copytree(ROOT / "docs", site / "docs")
    shutil.copy(ROOT / "mkdocs.yml", site / "mkdocs.yml")
    (site / "grpo_dist").symlink_to(ROOT / "grpo_dist")  # the hook imports the checkout's config
    with open(site / "docs" / "metrics.md", "a") as f:
        f.write(extra)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=site, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})


@pytest.mark.parametrize("link", ["[a page that is not there](no-such-page.md)",
                                  "[an anchor that is not there](errors.md#no-such-anchor)"])
def test_strict_build_fails_on_a_broken_link(tmp_path, link):
    pytest.importorskip("mkdocs")
    good = _build(tmp_path / "good", "")
    assert good.returncode == 0, good.stderr[-2000:]
    assert (tmp_path / "good" / "site" / "reference" / "config.html").exists()
    bad = _build(tmp_path / "bad", f"\n{link}\n")
    assert bad.returncode != 0
    out = bad.stdout + bad.stderr
    assert "WARNING" in out and "no-such-" in out and "Aborted with 1 warnings in strict mode" in out, out[-2000:]


def test_readme_links_reach_a_page_and_its_heading():
    """The README is not part of the site (mkdocs checks only docs/), so its links are checked here:
    each relative link names a file that exists, and its #anchor a heading of that page."""
    import re

    from markdown.extensions.toc import slugify

    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(links) > 20
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.is_file(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            slugs = {slugify(h.replace("`", ""), "-") for h in headings}
            assert anchor in slugs, (link, sorted(slugs))


def test_prose_placeholders_stay_text_and_code_is_untouched():
    mod = load_script(ROOT / "docs" / "hooks" / "placeholders.py")
    md = "| hf:<name> for a hub dataset | `hf:<name>` |\n```\nls <dir>\n```\ndefault <output_dir>/checkpoints\n"
    assert mod.escape_placeholders(md) == ("| hf:&lt;name&gt; for a hub dataset | `hf:<name>` |\n```\nls <dir>\n```\n"
                                          "default &lt;output_dir&gt;/checkpoints\n")
