"""The README's commands run as written on a fresh clone after `make demo`: every line of its
```bash blocks is read as a newcomer would type it, in order. Each command's first word must
resolve (a Makefile target, the `grpo-dist` console script with a real subcommand, a script of
the checkout, a program the venv installs), `grpo-dist` must be made available (the venv
activated) before its first bare use, `grpo-dist <sub> --help` works for each subcommand used,
each option is accepted by that subcommand's parser and each `--section.key VALUE` override is a
valid config key and value, and every input file or directory a command names exists in the
checkout or is made by a command before it (`make demo` writes runs/tiny_cpu)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ACTIVATE = ("source .venv/bin/activate", ". .venv/bin/activate")
# what each grpo-dist subcommand reads (its other path arguments are outputs): argparse dest names
INPUTS = {"train": ("config",), "eval": ("config", "adapter"), "plot": ("run_dir",)}
VENV_PROGRAMS = ("ray", "python", "pip", "wandb", "mkdocs")  # console scripts the venv installs


def readme_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks, in order: comments stripped, continuations joined."""
    out: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(shlex.join(words))
    return out


def _argv(cmd: str) -> list[str]:
    """The command's words without leading VAR=value assignments."""
    words = shlex.split(cmd)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words.pop(0)
    return words


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_-]+):", (ROOT / "Makefile").read_text(), flags=re.M))


def _made_by_make(target: str) -> list[str]:
    """The grpo-dist command lines of a Makefile target's recipe (`make demo` runs a training)."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, flags=re.M)
    return [ln.split("grpo-dist", 1)[1] for ln in (m.group(1).splitlines() if m else []) if "grpo-dist " in ln]


def _subcommands() -> dict:
    from grpo_dist.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "train" in a.choices)
    return sub.choices


def _outputs_of(sub: str, args) -> list[str]:
    """Where a grpo-dist command writes: a training's output_dir (relative to the checkout)."""
    if sub != "train" or getattr(args, "help_config", None) or getattr(args, "print_config", False):
        return []
    from grpo_dist.config import load_config

    return [str(load_config(args.config, args.overrides).output_dir)]


def check_commands(commands: list[str]) -> list[str]:
    """Every problem a newcomer would meet running ``commands`` in order (empty: none)."""
    problems: list[str] = []
    from grpo_dist.config import ConfigError, load_config

    subs = _subcommands()
    targets = _make_targets()
    table = re.search(r"^\[project\.scripts\]\n((?:[^\[\n].*\n)*)", (ROOT / "pyproject.toml").read_text(), flags=re.M)
    scripts = dict(re.findall(r"^([\w-]+)\s*=\s*\"([^\"]+)\"", table.group(1) if table else "", flags=re.M))
    venv_made = activated = False
    made: list[str] = []  # output directories written by the commands so far
    for cmd in commands:
        argv = _argv(cmd)
        first, rest = argv[0], argv[1:]
        if first == "make":
            bad = [t for t in rest if t not in targets]
            if bad:
                problems.append(f"{cmd}: no Makefile target {bad}")
            venv_made = True  # every target depends on the set-up (.venv)
            for t in rest:
                for line in _made_by_make(t):
                    ns, extra = subs["train"].parse_known_args(shlex.split(line)[1:])
                    ns.overrides = extra
                    made += _outputs_of("train", ns)
            continue
        if cmd in ACTIVATE:
            if not venv_made:
                problems.append(f"{cmd}: before any `make` created .venv")
            activated = True
            continue
        if first == "grpo-dist" and not activated:
            problems.append(f"{cmd}: `grpo-dist` is not on PATH here: the README must activate the venv "
                            f"(`{ACTIVATE[0]}`) after `make demo` and before its first grpo-dist command")
            activated = True  # said once
        if first == "grpo-dist":
            if scripts.get("grpo-dist") != "grpo_dist.cli:main":  # the parser checked here is the script's
                problems.append(f"{cmd}: grpo-dist is no console script of grpo_dist.cli:main in pyproject.toml")
                continue
            if not rest or rest[0] not in subs:
                problems.append(f"{cmd}: no grpo-dist subcommand {rest[:1]}")
                continue
            sub = rest[0]
            parser = subs[sub]
            try:
                ns, extra = parser.parse_known_args(rest[1:])
            except SystemExit:
                problems.append(f"{cmd}: grpo-dist {sub} rejects its options")
                continue
            if extra and sub not in ("train", "eval"):
                problems.append(f"{cmd}: grpo-dist {sub} takes no options {extra}")
                continue
            ns.overrides = extra
            if sub in ("train", "eval") and not getattr(ns, "help_config", None):
                try:  # --section.key VALUE: a config key, a valid value (what the CLI checks first)
                    load_config(ns.config, extra)
                except (ConfigError, FileNotFoundError) as e:
                    problems.append(f"{cmd}: {e}")
                    continue
            for dest in INPUTS.get(sub, ()):
                value = getattr(ns, dest, None)
                if value and not (ROOT / value).exists() and not any(Path(value).is_relative_to(m) for m in made):
                    problems.append(f"{cmd}: {value} is neither in the checkout nor made by a command before it")
            made += _outputs_of(sub, ns)
        elif first.startswith(("launch/", "benchmarks/", "./")) or first.endswith((".sh", ".py")):
            path = ROOT / first
            if not (path.is_file() and path.stat().st_mode & 0o111):
                problems.append(f"{cmd}: {first} is not an executable file of the checkout")
            if first == "launch/submit_job.sh":  # CONFIG [overrides]: what grpo-dist train would accept
                try:
                    load_config(str(ROOT / rest[0]), rest[1:])
                except (ConfigError, FileNotFoundError, IndexError) as e:
                    problems.append(f"{cmd}: {e}")
        elif first == "python":
            if not rest or not (ROOT / rest[0]).is_file():
                problems.append(f"{cmd}: no file {rest[:1]} in the checkout")
        elif first in VENV_PROGRAMS:
            if not activated:
                problems.append(f"{cmd}: {first} is the venv's: activate it first")
            if not (Path(sys.executable).parent / first).exists():
                problems.append(f"{cmd}: the venv has no {first}")
        else:
            problems.append(f"{cmd}: the first word {first!r} resolves to nothing this test knows")
    return problems


@pytest.fixture(scope="module")
def commands() -> list[str]:
    return readme_commands((ROOT / "README.md").read_text())


def test_every_readme_command_resolves_after_make_demo(commands, monkeypatch):
    monkeypatch.chdir(ROOT)  # the README's relative paths are the checkout's
    assert len(commands) >= 15 and commands[0].startswith("make demo")
    assert check_commands(commands) == []


def test_grpo_dist_help_for_each_subcommand_the_readme_uses(commands, capsys):
    from grpo_dist.cli import main

    used = sorted({_argv(c)[1] for c in commands if _argv(c)[0] == "grpo-dist"})
    assert {"train", "eval", "get-model", "plot", "doctor", "make-tiny-model"} <= set(used)
    for sub in used:
        with pytest.raises(SystemExit) as e:
            main([sub, "--help"])
        assert e.value.code == 0, sub
        assert f"usage: grpo-dist {sub}" in capsys.readouterr().out, sub


def test_the_check_catches_what_a_newcomer_would_meet(monkeypatch):
    """Each mistake fails the check: grpo-dist before the venv is active, a missing target, file or
    option, an unknown config key, an input nothing made."""
    monkeypatch.chdir(ROOT)
    ok = ["make demo", ACTIVATE[0]]
    assert check_commands(ok + ["grpo-dist plot runs/tiny_cpu"]) == []  # make demo writes runs/tiny_cpu
    cases = {
        "not on PATH": ["make demo", "grpo-dist doctor"],
        "no Makefile target": ok + ["make demo-all"],
        "no grpo-dist subcommand": ok + ["grpo-dist evaluate --config configs/tiny_cpu.yaml"],
        "rejects its options": ok + ["grpo-dist make-tiny-model models/t --size huge"],
        "takes no options": ok + ["grpo-dist doctor --fast"],
        "unknown key": ok + ["grpo-dist train --config configs/tiny_cpu.yaml --trainer.seeds 1"],
        "neither in the checkout": ok + ["grpo-dist eval --config configs/tiny_cpu.yaml --adapter runs/my/adapter"],
        "not an executable file": ok + ["launch/start_everything.sh"],
        "resolves to nothing": ok + ["grpo_dist train"],
    }
    for want, cmds in cases.items():
        problems = check_commands(cmds)
        assert len(problems) == 1 and want in problems[0], (want, problems)
