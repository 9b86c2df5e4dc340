"""Batch inference as an elastic job (pw.elastic_map) on real JAX CPU devices (embedded:2x4), slices lost
and repaired by pathways_kernel.emulator.faults from inside the batches, as a loss strikes mid-batch."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from waiting import wait_until

import pathways_kernel as pw
from pathways_kernel.emulator import chaosmonkey, faults

VOCAB, WIDTH, PROMPT, NEW = 16, 32, 4, 6
REQUESTS, BATCH = 32, 4


@pytest.fixture(autouse=True)
def all_slices_up(local_session):
    chaosmonkey.chaos_off()
    yield local_session
    chaosmonkey.chaos_off()


def init_params():
    rng = np.random.default_rng(0)
    return {
        "embed": rng.normal(size=(VOCAB, WIDTH)).astype(np.float32) * 0.3,
        "out": rng.normal(size=(WIDTH, VOCAB)).astype(np.float32) / WIDTH**0.5,
    }


@jax.jit
def generate(params, prompts, seeds):
    """NEW tokens per prompt, sampled with a key of the request's own (its seed): a function of the request."""

    def one(prompt, seed):
        key = jax.random.key(seed)

        def step(carry, i):
            token, key = carry
            key, sub = jax.random.split(key)
            h = jnp.tanh(params["embed"][token] + 0.1 * i)
            return (jax.random.categorical(sub, h @ params["out"]).astype(jnp.int32), key), token

        _, tokens = jax.lax.scan(step, (prompt[-1], key), jnp.arange(NEW))
        return tokens

    return jax.vmap(one)(prompts, seeds)


def requests():
    rng = np.random.default_rng(1)
    return np.concatenate(
        [rng.integers(0, VOCAB, size=(REQUESTS, PROMPT)), np.arange(REQUESTS)[:, None]], axis=1
    ).astype(np.int32)


def make_fn(actions=None, ran=None):
    """``fn`` of elastic_map; ``actions``: {(slice, nth batch that slice runs): [(fail|repair, slice)]}, done
    after the batch is dispatched and before its output is read back (mid-batch); ("await", condition):
    wait until ``condition(report)`` (the job's ``last_run``)."""
    actions = dict(actions or {})
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def fn(params, batch, mesh):
        ids = {d.id for d in mesh.devices.flat}
        index = next(sl.index for sl in pw.session().topology.slices if {d.id for d in sl.devices} == ids)
        out = generate(params, batch[:, :PROMPT], batch[:, PROMPT])
        with lock:
            nth = counts[index] = counts.get(index, 0) + 1
            if ran is not None:
                ran.append((index, int(batch[0, PROMPT]) // BATCH))
            todo = actions.pop((index, nth), ())
        for action, which in todo:
            if action == "await":  # until the job's report says ``which``: the order under any load
                assert wait_until(lambda ask=which: ask(pw.elastic_map.last_run), timeout=60)
            else:
                (faults.fail_slice if action == "fail" else faults.repair_slice)(which)
        return out

    return fn


def fault_free():
    return pw.elastic_map(make_fn(), requests(), init_params(), batch_size=BATCH, name="reference")


def test_a_slice_lost_mid_batch_redoes_only_that_batch_and_the_outputs_equal_a_fault_free_run():
    expected = fault_free()
    assert expected.shape == (REQUESTS, NEW)
    ran: list[tuple[int, int]] = []
    seq = pw.session().events.last(1)[0].seq
    out = pw.elastic_map(
        make_fn({(1, 2): [("fail", 1)], (0, 3): [("await", lambda r: r.losses)]}, ran),
        requests(),
        init_params(),
        batch_size=BATCH,
    )
    np.testing.assert_array_equal(out, expected)
    report = pw.elastic_map.last_run
    # Slice 1 was lost in its second batch: only that batch ran twice, the batches it finished before are kept.
    lost_batch = [b for i, b in ran if i == 1][1]
    assert report.redone == [lost_batch] and report.losses == 1
    batches = [b for _, b in ran]
    assert sorted(batches) == sorted([*range(REQUESTS // BATCH), lost_batch])
    assert report.slices[1].batches == 1 and report.slices[0].batches == REQUESTS // BATCH - 1
    retries = [e for e in pw.session().events.since(seq) if e.kind == "retry"]
    assert len(retries) == 1 and f"slice 1 lost mid-batch, batch {lost_batch}" in retries[0].detail
    assert "\n" not in retries[0].to_text()


def test_a_repaired_slice_takes_requests_again():
    expected = fault_free()
    ran: list[tuple[int, int]] = []
    # Slice 1 lost in its first batch; slice 0 repairs it in its second, once the job saw the loss, and
    # in its third waits for slice 1 to hand a batch back.
    out = pw.elastic_map(
        make_fn(
            {
                (1, 1): [("fail", 1)],
                (0, 2): [("await", lambda r: r.losses), ("repair", 1)],
                (0, 3): [("await", lambda r: r.slices[1].batches)],
            },
            ran,
        ),
        requests(),
        init_params(),
        batch_size=BATCH,
    )
    np.testing.assert_array_equal(out, expected)
    report = pw.elastic_map.last_run
    assert report.losses == 1 and report.rejoins == 1 and len(report.redone) == 1
    assert report.slices[1].batches >= 1, ran  # after the repair, slice 1 ran batches again
    assert report.slices[1].tokens_per_s > 0 and report.slices[0].tokens_per_s > 0


def test_tokens_per_second_per_slice_are_metrics():
    # Slice 0 waits in its second batch for slice 1 to hand one back: both run batches under any load.
    fn = make_fn({(0, 2): [("await", lambda r: 1 in r.slices and r.slices[1].batches)]})
    pw.elastic_map(fn, requests(), init_params(), batch_size=BATCH, name="tokens")
    frame = pw.metrics("tokens")
    for column in ("slice0_tokens_per_s", "slice1_tokens_per_s"):
        assert column in frame and (frame[column].dropna() > 0).any()


def test_a_loss_of_every_slice_of_the_job_waits_for_one_saying_so(capsys):
    expected = fault_free()

    def repair_once_it_waits():
        wait_until(lambda: pw.elastic_map.last_run.waiting, timeout=60)  # what the user sees: the line below
        faults.repair_slice(1)

    repairer = threading.Thread(target=repair_once_it_waits)
    ran: list[tuple[int, int]] = []
    inner = make_fn({(1, 1): [("fail", 1)]}, ran)

    def fn(params, batch, mesh):
        if not ran:
            repairer.start()
        return inner(params, batch, mesh)

    out = pw.elastic_map(fn, requests(), init_params(), batch_size=BATCH, slices=[1], wait_s=60)
    repairer.join(5)
    np.testing.assert_array_equal(out, expected)
    assert pw.elastic_map.last_run.losses == 1 and pw.elastic_map.last_run.slices[1].batches == REQUESTS // BATCH
    said = capsys.readouterr().err
    assert "elastic_map 'fn': no slice of its slices [1] is up; waiting up to 60 s for one to come back" in said


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([],), {}, "needs at least one request; the request list is empty"),
        ((np.zeros((4, 2)),), {"batch_size": 0}, "batch_size must be a whole number of at least 1, got 0"),
        ((np.zeros((4, 2)),), {"batch_size": float("nan")}, "batch_size must be a whole number of at least 1, got nan"),
        ((np.zeros((4, 2)),), {"batch_size": -3}, "batch_size must be a whole number of at least 1, got -3"),
        ((np.zeros((4, 2)),), {"wait_s": float("nan")}, "wait_s must be a number of seconds, at least 0, got nan"),
        ((np.zeros((4, 2)),), {"slices": [7]}, "slices must name each slice of the job once, from [0, 1], got [7]"),
        ((5,), {}, "requests must be a list or an array of requests (one per row), got int"),
    ],
)
def test_bad_input_is_one_line_and_nothing_runs(args, kwargs, message):
    calls = []
    with pytest.raises(pw.PathwaysError) as info:
        pw.elastic_map(lambda p, b, m: calls.append(b), *args, **kwargs)
    assert str(info.value) == message or message in str(info.value)
    assert "\n" not in str(info.value) and not calls


def test_the_docs_example_runs_and_help_shows_how_to_call_it(capsys):
    # docs/rl.md's "Inference on its own" block, run as written; help(pw.elastic_map) shows the call and its example.
    import os
    import pydoc
    import re

    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "rl.md")
    with open(docs, encoding="utf-8") as f:
        section = f.read().split("## Inference on its own", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(block, docs, "exec"), namespace)
    tokens = namespace["tokens"]
    assert tokens.shape == (32, 6) and tokens.dtype == np.int32
    assert "elastic_map 'generate': 32 requests in 4 batches in " in capsys.readouterr().out
    page = pydoc.render_doc(pw.elastic_map, renderer=pydoc.plaintext)
    assert "Run ``fn(params, batch, mesh)`` over ``requests`` in batches" in page
    assert "tokens = pw.elastic_map(generate, prompts, params, batch_size=8)" in page
