"""Figures a reader can trace, history where it belongs.

Every picture in the user-facing docs (README.md, docs/*.md) is captioned, in the paragraph right
after it, with the date, the commit, the machine (CPU vector units or GPU), the dtype and the
command of the run it was drawn from; each results table of the README has the same in its
section. The user-facing docs name no internal issue numbers and none of the development-only GPU
lease machinery (`../shared/`, `make gpu-stage`, `make gpu-lease`: docs/development.md has it);
superseded recipes and their figures live in CHANGELOG.md.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"\bcommits? [0-9a-f]{7,40}\b")
MACHINE = re.compile(r"AVX|AMX|NEON|SVE|\bH[12]00\b|\bA100\b|\bGPU\b")
DTYPE = re.compile(r"\b(float32|bfloat16|bf16|float16|fp16|fp32)\b")
COMMAND = re.compile(r"`(grpo-dist|python3?|make) [^`]+`")
NEEDS = {"date": DATE, "commit": COMMIT, "machine": MACHINE, "dtype": DTYPE, "command": COMMAND}
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.I)
DEV_ONLY = ("../shared/", "make gpu-stage", "make gpu-lease")


def user_docs() -> list[Path]:
    """README.md and the site's pages but docs/development.md (which is for developers)."""
    return [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "development.md"]


def missing(text: str) -> list[str]:
    """What of date, commit, machine, dtype and command ``text`` does not name."""
    return [name for name, pattern in NEEDS.items() if not pattern.search(text)]


def captions(text: str) -> list[tuple[str, str]]:
    """(image path, the paragraph right after the image) for every image in a markdown text."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        for path in IMAGE.findall(line):
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            para = []
            while j < len(lines) and lines[j].strip():
                para.append(lines[j])
                j += 1
            out.append((path, "\n".join(para)))
    return out


def results_sections(text: str) -> list[tuple[str, str]]:
    """(heading, section text) of each section holding a results table: one whose header row
    has a `before` or a `figure` column."""
    out = []
    for section in re.split(r"^(?=#{1,4} )", text, flags=re.M):
        headers = re.findall(r"^(\|.*\|)\n\|[-| :]+\|\n", section, flags=re.M)
        if any(re.search(r"\|\s*(before|figure)\s*\|", h) for h in headers):
            out.append((section.splitlines()[0], section))
    return out


def test_every_image_is_captioned_with_its_run():
    seen = 0
    problems = []
    for doc in user_docs():
        for path, caption in captions(doc.read_text()):
            seen += 1
            if not (doc.parent / path).is_file():
                problems.append(f"{doc.name}: {path}: no such file")
            gaps = missing(caption)
            if gaps:
                problems.append(f"{doc.name}: {path}: the caption after it names no {', '.join(gaps)}")
    assert seen >= 4  # README's curves, getting-started's two, multi-turn's calculator
    assert not problems, "\n".join(problems)


def test_every_readme_results_table_says_where_it_comes_from():
    sections = results_sections((ROOT / "README.md").read_text())
    assert len(sections) >= 5  # the demo, the real model, the smoke run, the GPU, the calculator
    problems = [f"{head}: names no {', '.join(gaps)}" for head, text in sections if (gaps := missing(text))]
    assert not problems, "\n".join(problems)


def test_user_docs_name_no_issue_numbers_and_no_lease_machinery():
    problems = []
    for doc in user_docs():
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            problems += [f"{doc.name}:{n}: {m.group(0)!r}" for m in ISSUE.finditer(line)]
            problems += [f"{doc.name}:{n}: {s!r} (docs/development.md)" for s in DEV_ONLY if s in line]
    assert not problems, "\n".join(problems)


def test_superseded_recipes_live_in_the_changelog():
    changelog = ROOT / "CHANGELOG.md"
    assert changelog.is_file()
    assert "0.077" in changelog.read_text() and "0.965" in changelog.read_text()  # the hacked recipe's figures
    for doc in user_docs():
        assert "0.965" not in doc.read_text(), f"{doc.name} still reports the superseded recipe"
    assert "CHANGELOG.md" in (ROOT / "README.md").read_text()


def test_the_checks_catch_what_they_look_for():
    """The patterns are not vacuous: a bare caption, an issue number, a lease target are caught."""
    bare = "![curves](img/x.png)\n\nThe reward per step.\n"
    assert missing(captions(bare)[0][1]) == ["date", "commit", "machine", "dtype", "command"]
    good = ("![curves](img/x.png)\n\n2026-11-27, commit 77e961e, AVX-512, float32,\n"
            "`grpo-dist train --config configs/smollm2_cpu.yaml`.\n")
    assert missing(captions(good)[0][1]) == []
    assert ISSUE.search("as reported in Issue 45 item 4") and ISSUE.search("(issue #46)")
    assert not ISSUE.search("an issue with 2 engines")
    table = "## X\n\n| held-out | before | after |\n|---|---|---|\n| a | 0.1 | 0.2 |\n"
    assert [h for h, _ in results_sections(table)] == ["## X"]
