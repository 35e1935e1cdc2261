"""A user-defined rollout function (``rollout.rollout_fn``): the escape hatch past environments.

``rollout.rollout_fn: module.path:fn`` (or ``path/to/file.py:fn``) replaces the environment loop:
it is called once per trajectory (``rollout.group_size`` times per dataset row) as
``fn(client, row, **rollout.rollout_fn_kwargs)``, plain or ``async def``:

* ``client`` (:class:`EngineClient`): ``generate(prompt_ids, max_tokens=, temperature=, top_p=,
  top_k=, stop=) -> Generation(token_ids, logprobs, text, finish_reason)`` (``temperature``,
  ``top_p``, ``top_k`` may only repeat the run's ``rollout.*``: the learner scores at those; token ids in, sampled
  ids and their behaviour log-probs out; an ``async def`` function awaits ``agenerate``), the
  ``tokenizer``, ``prompt_ids`` (the row's prompt as the pipeline tokenized it), ``sampling`` (the
  run's :class:`SamplingSpec`), ``max_model_len``. Call k of a trajectory samples with a seed
  derived from the trajectory's (the first with the trajectory's own), so runs repeat. Calls of
  all trajectories are batched: one engine call once every running function waits on one (an
  engine call that raised fails the worker's call with that error, whatever the functions do with it);
* ``row``: the dataset row, ``{"prompt": ..., **columns}``.

It returns a dict: ``completion_ids`` (every token after the prompt), ``loss_mask`` (1 = trained,
0 = not: e.g. an injected user turn) and ``logprobs`` (the behaviour log-prob of every token with
mask 1; anything, e.g. 0.0 or None, where the mask is 0), all of one length; optional
``prompt_ids`` (default ``client.prompt_ids``), ``reward`` (the ``env_reward`` column), ``info``
(numeric tool counters summed into the columns as environments' are), ``stop_reason`` (one of
:class:`grpo_dist.types.StopReason`: done (the default), length, budget, context, max_turns,
timeout, env_error, abort; anything but done counts as truncated) and ``messages`` (the turns after the prompt, for the
W&B conversation table). What it returns is checked; a violation (or an exception) stops the run
with an error naming the function. The rows become Rollouts exactly as environment trajectories
do (same columns), so rewards, batches and the learner treat them alike.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Callable

from grpo_dist.envs.base import acall, env_loop, run
from grpo_dist.rollout.base import Generator, SamplingSpec, generate_each
from grpo_dist.rollout.trajectory import make_rollout, turn_seed
from grpo_dist.types import TOOL_COUNTERS, Rollout, RolloutGroup, StopReason
from grpo_dist.util.plugins import load_function

REQUIRED = ("completion_ids", "loss_mask", "logprobs")
OPTIONAL = ("prompt_ids", "reward", "info", "stop_reason", "messages")


class RolloutFnError(ValueError):
    """What a user rollout function returned breaks the contract (or it raised)."""


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"
    version: int | None = None  # the weight version that sampled it (streaming; None: the worker call's)


def load_rollout_fn(spec: str) -> Callable[..., Any]:
    """The function ``spec`` names; ValueError naming it."""
    return load_function(spec, "rollout function")


class _Batcher:
    """Collects the generate calls of every running trajectory; once each running one waits on a
    call, runs them as engine calls (one per distinct sampling) in a thread. Lives on the
    environments' event loop (``grpo_dist.envs.base.env_loop``). An engine call that raised
    stops it (``failed``): the engine is not called again, and :meth:`gather` raises that error."""

    def __init__(self, engine: Generator, live: int):
        self.engine, self.live, self.pending = engine, live, []
        self.wake = asyncio.Event()
        self.closed: BaseException | None = None
        self.failed: BaseException | None = None  # the engine's error: the worker call fails with it

    def close(self, why: BaseException) -> None:
        """No more engine calls: every waiting call and every later one raises ``why`` (so the
        functions still running, and their threads, end)."""
        self.closed = why
        batch, self.pending = self.pending, []
        for *_, fut in batch:
            if not fut.done():
                fut.set_exception(why)

    async def submit(self, ids: list[int], spec: SamplingSpec, seed: int | None) -> Generation:
        if self.closed is not None:
            raise self.closed
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((ids, spec, seed, fut))
        self.wake.set()
        return await fut

    def finished(self) -> None:
        self.live -= 1
        self.wake.set()

    async def drive(self) -> None:
        while self.live > 0 and self.closed is None:
            await self.wake.wait()
            self.wake.clear()
            if self.pending and len(self.pending) >= self.live:
                batch, self.pending = self.pending, []
                try:
                    outs = await asyncio.to_thread(self._generate, batch)
                except Exception as e:  # noqa: BLE001 - the engine is suspect: no more calls, the worker call fails
                    self.failed = e
                    self.pending = batch + self.pending
                    self.close(e)  # every waiting function gets the engine's error, and every later call
                    return
                for (*_, fut), out in zip(batch, outs):
                    if not fut.done():
                        fut.set_result(out)

    async def gather(self, coros: list, grace: float = 30.0) -> list:
        """Run the trajectories ``coros``, their engine calls driven here; their results in order.
        The first error ends them all: the engine's (an engine call raised) or a trajectory's own
        (a rollout function raised). Every engine call waiting or made after it raises, so the
        trajectories end; those still running after ``grace`` s are cancelled (a plain function's
        thread is abandoned). Then that error is raised: the engine's with its own type (vLLM's
        ``EngineDeadError`` means a dead engine, which the driver replaces)."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        driver = asyncio.ensure_future(self.drive())
        everything = asyncio.gather(*tasks)
        try:
            await asyncio.wait([everything, driver], return_when=asyncio.FIRST_COMPLETED)
            if self.failed is None and (not everything.done() or everything.exception() is None):
                return list(await everything)
            first = self.failed or everything.exception()
            if self.closed is None:  # a trajectory raised: its siblings' engine calls fail from now on
                self.close(RuntimeError(f"a sibling trajectory failed ({type(first).__name__})"))
            await asyncio.wait(tasks, timeout=grace)  # bounded: a function that swallows the error is abandoned
            raise first
        finally:
            driver.cancel()
            for t in tasks:
                t.cancel()
                if t.done() and not t.cancelled():
                    t.exception()  # retrieved: no "never retrieved" warnings
            if not everything.done():
                everything.cancel()
            elif not everything.cancelled():
                everything.exception()

    def _generate(self, batch: list) -> list[Generation]:
        samples = generate_each(self.engine, [ids for ids, *_ in batch], [s for _, s, *_ in batch],
                                [seed for _, _, seed, _ in batch])
        return [Generation(list(s.token_ids), list(s.logprobs), s.text, s.finish_reason) for s in samples]


class EngineClient:
    """What a rollout function generates with (one per trajectory)."""

    def __init__(self, submit: Callable[..., Any], tokenizer: Any, prompt_ids: list[int], sampling: SamplingSpec,
                 seed: int | None, max_model_len: int, loop: asyncio.AbstractEventLoop):
        self._submit, self._loop, self._seed = submit, loop, seed
        self.tokenizer, self.prompt_ids, self.sampling, self.max_model_len = tokenizer, list(prompt_ids), sampling, max_model_len
        self.calls = 0

    def _spec(self, prompt_ids: list[int], max_tokens, temperature, top_p, top_k, stop) -> SamplingSpec:
        s = self.sampling
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"generate: {len(prompt_ids)} prompt tokens leave no room in model.max_model_len "
                             f"{self.max_model_len}")
        for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
            if value is not None and value != getattr(s, key):
                # the learner scores every sampled token at rollout.* (the behaviour log-probs too)
                raise ValueError(f"generate: {key}={value} differs from rollout.{key} {getattr(s, key)}: the learner "
                                 f"scores every sampled token at rollout.{key}; leave {key} out")
        return SamplingSpec(n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                            max_tokens=min(room, s.max_tokens if max_tokens is None else int(max_tokens)),
                            stop=list(s.stop if stop is None else stop))

    async def agenerate(self, prompt_ids: list[int], *, max_tokens: int | None = None, temperature: float | None = None,
                        top_p: float | None = None, top_k: int | None = None,
                        stop: list[str] | None = None) -> Generation:
        ids = [int(t) for t in prompt_ids]
        spec = self._spec(ids, max_tokens, temperature, top_p, top_k, stop)
        seed = None if spec.greedy else turn_seed(self._seed, self.calls)
        self.calls += 1
        return await self._submit(ids, spec, seed)

    def generate(self, prompt_ids: list[int], **sampling: Any) -> Generation:
        """Blocking: for a plain (not ``async def``) rollout function, which runs in a thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run_coroutine_threadsafe(self.agenerate(prompt_ids, **sampling), self._loop).result()
        raise RuntimeError("client.generate blocks: an async rollout function awaits client.agenerate")


class UserRollouts:
    """``rollout.rollout_fn`` of a rollout worker: trajectories of a batch of records."""

    def __init__(self, spec: str, kwargs: dict[str, Any] | None = None):
        self.spec, self.kwargs = spec, dict(kwargs or {})
        self.fn = load_rollout_fn(spec)

    @classmethod
    def from_config(cls, r: Any) -> "UserRollouts | None":
        return cls(r.rollout_fn, r.rollout_fn_kwargs) if r.rollout_fn else None

    def generate(self, engine: Generator, records: list[Any], prompt_ids: list[list[int]], spec: SamplingSpec,
                 seeds: list[list[int]] | None, max_model_len: int, version: int) -> list[RolloutGroup]:
        """``spec.n`` trajectories per record (seeds[i][j]: trajectory j of record i)."""
        return run(self._all(engine, records, prompt_ids, spec, seeds, max_model_len, version))

    async def _all(self, engine, records, prompt_ids, spec, seeds, max_model_len, version) -> list[RolloutGroup]:
        batcher = _Batcher(engine, len(records) * spec.n)
        loop = env_loop()

        async def one(i: int, j: int) -> Rollout:
            rec, pids = records[i], prompt_ids[i]
            client = EngineClient(batcher.submit, engine.tokenizer, pids, spec,
                                  seeds[i][j] if seeds is not None else None, max_model_len, loop)
            try:
                out = await acall(self.fn, client, dict(rec.as_example()), **self.kwargs)
            except Exception as e:
                raise RolloutFnError(f"rollout.rollout_fn {self.spec!r} raised on record {rec.id}: "
                                     f"{type(e).__name__}: {e}") from e
            finally:
                batcher.finished()
            return to_rollout(self.spec, rec, pids, out, client.calls, version, engine.tokenizer, max_model_len)

        # one function failed, or the engine: the others' engine calls fail too, so they (and their threads) end
        flat = await batcher.gather([one(i, j) for i in range(len(records)) for j in range(spec.n)])
        return [RolloutGroup(prompt_id=rec.id, rollouts=list(flat[i * spec.n:(i + 1) * spec.n]))
                for i, rec in enumerate(records)]


def to_rollout(name: str, rec: Any, prompt_ids: list[int], out: Any, calls: int, version: int, tok: Any,
               max_model_len: int) -> Rollout:
    """The Rollout of what the function returned, after :func:`check_result`."""
    out = check_result(name, rec.id, out, prompt_ids, max_model_len, len(tok) if tok is not None else None)
    mask = out["loss_mask"]
    logprobs = [float(lp) if m == 1 else 0.0 for lp, m in zip(out["logprobs"], mask)]
    info = out.get("info") or {}
    counters = {k: info[k] for k in TOOL_COUNTERS if isinstance(info.get(k), (int, float))}
    return make_rollout(tok, rec, out["prompt_ids"], out["completion_ids"], logprobs, mask,
                        str(out.get("stop_reason") or StopReason.DONE), calls, out.get("reward"), counters,
                        out.get("messages"), version, [version] * calls)


def check_result(name: str, record_id: Any, out: Any, prompt_ids: list[int], max_model_len: int,
                 vocab: int | None) -> dict[str, Any]:
    """``out`` as a dict with ``prompt_ids``; RolloutFnError naming ``name`` and what is wrong."""
    def bad(msg: str) -> RolloutFnError:
        return RolloutFnError(f"rollout.rollout_fn {name!r} returned {msg} (record {record_id})")

    if not isinstance(out, dict):
        raise bad(f"a {type(out).__name__}, not a dict with {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in out]
    unknown = sorted(set(out) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        raise bad("a dict " + "; ".join(([f"without {', '.join(missing)}"] if missing else [])
                                        + ([f"with unknown keys {', '.join(unknown)} (known: "
                                            f"{', '.join(REQUIRED + OPTIONAL)})"] if unknown else [])))
    out = dict(out)
    out.setdefault("prompt_ids", prompt_ids)
    for key in ("prompt_ids", "completion_ids", "loss_mask", "logprobs"):
        if not isinstance(out[key], (list, tuple)) and not hasattr(out[key], "tolist"):
            raise bad(f"{key} as a {type(out[key]).__name__}, not a list")
        out[key] = list(out[key].tolist() if hasattr(out[key], "tolist") else out[key])
    n = {k: len(out[k]) for k in ("completion_ids", "loss_mask", "logprobs")}
    if len(set(n.values())) != 1:
        raise bad("lists of different lengths: " + ", ".join(f"{k} {v}" for k, v in n.items()))
    for key in ("prompt_ids", "completion_ids"):
        wrong = [t for t in out[key] if isinstance(t, bool) or not isinstance(t, int) or t < 0
                 or (vocab is not None and t >= vocab)]
        if wrong:
            raise bad(f"{key} with {len(wrong)} values that are not token ids (first: {wrong[0]!r}"
                      + (f", vocabulary size {vocab})" if vocab is not None else ")"))
    if not out["prompt_ids"]:
        raise bad("empty prompt_ids")
    masks = [m for m in out["loss_mask"] if m not in (0, 1)]
    if masks:
        raise bad(f"loss_mask values other than 0 and 1 (first: {masks[0]!r})")
    out["loss_mask"] = [int(m) for m in out["loss_mask"]]
    for t, (lp, m) in enumerate(zip(out["logprobs"], out["loss_mask"])):
        if m == 1 and (isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 0):
            raise bad(f"no behaviour log-prob for token {t} (loss mask 1): {lp!r} (a finite number <= 0 is needed)")
    total = len(out["prompt_ids"]) + n["completion_ids"]
    if total > max_model_len:
        raise bad(f"{total} tokens (prompt + completion), more than model.max_model_len {max_model_len}")
    if out.get("info") is not None and not isinstance(out["info"], dict):
        raise bad(f"info as a {type(out['info']).__name__}, not a dict")
    if out.get("reward") is not None and not isinstance(out["reward"], (int, float)):
        raise bad(f"reward {out['reward']!r}, not a number")
    if out.get("stop_reason") is not None and str(out["stop_reason"]) not in {str(r) for r in StopReason}:
        raise bad(f"stop_reason {out['stop_reason']!r}, not one of {', '.join(str(r) for r in StopReason)}")
    return out
