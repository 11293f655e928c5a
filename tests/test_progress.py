"""rspo.progress: plain lines in a log (every N steps, forced lines, the last state on close) that
parse back to the numbers shown, a tqdm bar on a terminal instead, and no output when quiet or on
a rank other than 0. The commands' own progress lines are checked in test_train, test_pretrain
and test_countdown_data."""

from __future__ import annotations

import io

import pytest

from rspo.progress import Progress, format_seconds, format_value, parse_line, train_progress_metrics


class Clock:
    """A fake time.monotonic: each call returns the current value; tick() advances it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def tick(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr("rspo.progress._now", c)
    return c


def lines_of(stream: io.StringIO) -> list[dict]:
    parsed = [parse_line(ln) for ln in stream.getvalue().splitlines()]
    assert all(p is not None for p in parsed), stream.getvalue()
    return parsed


def test_plain_lines_carry_step_total_elapsed_eta_and_metrics(clock):
    out = io.StringIO()
    prog = Progress("train gmpo-rs0.8-s0", 4, stream=out, every=1)
    prog.update(0, {"reward": None, "val": 0.25}, force=True)  # validation before the first step
    for step in range(1, 5):
        clock.tick(2.0)
        prog.update(step, {"reward": 0.1 * step, "val": None, "gamma": 0.99123, "ppo_kl": 2.1e-5})
    prog.close()
    rows = lines_of(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert {r["label"] for r in rows} == {"train gmpo-rs0.8-s0"} and {r["total"] for r in rows} == {4}
    assert [r["percent"] for r in rows] == [0, 25, 50, 75, 100]
    assert rows[0]["metrics"] == {"s/step": None, "reward": None, "val": 0.25}
    r2 = rows[2]
    assert r2["elapsed_s"] == 4 and r2["eta_s"] == 4  # 2 s per step, 2 steps left
    assert r2["metrics"]["s/step"] == pytest.approx(2.0)
    assert r2["metrics"]["reward"] == pytest.approx(0.2) and r2["metrics"]["val"] is None
    assert r2["metrics"]["gamma"] == pytest.approx(0.9912) and r2["metrics"]["ppo_kl"] == pytest.approx(2.1e-5)
    assert list(r2["metrics"]) == ["s/step", "reward", "val", "gamma", "ppo_kl"]  # the caller's order
    assert rows[-1]["eta_s"] == 0
    text = out.getvalue().splitlines()[2]
    assert text.startswith("[train gmpo-rs0.8-s0] step 2/4 (50%) elapsed 0:00:04 eta 0:00:04 s/step 2 reward 0.2 val -")


def test_every_n_steps_forced_lines_and_the_last_state_on_close(clock):
    out = io.StringIO()
    prog = Progress("pretrain countdown", 1000, stream=out)  # every = 1% = 10 steps
    for step in range(1, 996):
        clock.tick(0.01)
        prog.update(step, {"loss": 1.0 / step, "acc": 0.5 if step == 505 else None}, force=step == 505)
    prog.close()  # stopped at 995: the last state is written although 995 is not a multiple of 10
    steps = [r["step"] for r in lines_of(out)]
    assert steps == [1] + list(range(10, 501, 10)) + [505] + list(range(510, 991, 10)) + [995]
    assert lines_of(out)[51]["metrics"]["acc"] == 0.5


def test_a_slow_loop_writes_at_least_one_line_per_interval(clock):
    out = io.StringIO()
    prog = Progress("eval countdown base val", 10_000, unit="prompt", stream=out, interval=30)
    prog.update(1)
    for n in range(2, 40):
        clock.tick(10.0)
        prog.update(n)
    rows = lines_of(out)
    assert [r["step"] for r in rows] == [1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 37]
    assert rows[0]["unit"] == "prompt" and "s/prompt" in rows[0]["metrics"]


def test_resumed_loop_eta_counts_only_the_work_done_here(clock):
    out = io.StringIO()
    prog = Progress("train x", 100, initial=90, stream=out, every=1)
    clock.tick(5.0)
    prog.update(91, {})
    row = lines_of(out)[0]
    assert row["step"] == 91 and row["elapsed_s"] == 5 and row["eta_s"] == 45


def test_quiet_and_other_ranks_write_nothing():
    for kw in ({"quiet": True}, {"enabled": False}):
        out = io.StringIO()
        with Progress("train x", 3, stream=out, every=1, **kw) as prog:
            for i in range(1, 4):
                prog.update(i, {"reward": 1.0}, force=True)
            prog.write("hello")
        assert out.getvalue() == ""


def test_a_terminal_gets_a_tqdm_bar_not_plain_lines():
    out = io.StringIO()
    with Progress("train x", 3, stream=out, tty=True) as prog:
        for i in range(1, 4):
            prog.update(i, {"reward": 0.5}, force=True)
    text = out.getvalue()
    assert "\r" in text and "train x" in text and "reward 0.5" in text and "3/3" in text
    assert not any(parse_line(ln) for ln in text.replace("\r", "\n").splitlines())


def test_unknown_total_and_other_lines():
    out = io.StringIO()
    prog = Progress("generate train", None, unit="record", stream=out)
    prog.update(1, {"split": "train"})
    row = lines_of(out)[0]
    assert row["total"] is None and row["percent"] is None and row["eta_s"] is None
    assert row["metrics"]["split"] == "train"
    assert parse_line("Loading weights: 100%|####| 2/2") is None
    assert parse_line('{"run_name": "x", "steps": 2}') is None


def test_value_and_time_formats():
    assert format_seconds(3725) == "1:02:05" and format_seconds(90061) == "25:01:01" and format_seconds(None) == "-"
    assert format_value(None) == "-" and format_value(float("nan")) == "-" and format_value(True) == "1"
    assert format_value(0.531234) == "0.5312" and format_value(0.0) == "0" and format_value(12) == "12"
    assert format_value(123456.0) == "1.235e+05" and format_value(1234.56) == "1234.6"
    assert format_value("two words") == "two_words"


def test_train_progress_metrics_map_the_trainer_keys():
    m = {
        "critic/score/mean": 0.5,
        "router/shift_ratio_mean": 0.99,
        "router/shift_clipfrac": 0.01,
        "actor/ppo_kl": 0.002,
        "actor/pg_clipfrac": 0.03,
        "actor/entropy": 0.4,
        "val/val_target/score": 0.2,
    }
    shown = train_progress_metrics(m, ["val", "val_target"])
    assert shown == {
        "reward": 0.5,
        "val": None,
        "val_target": 0.2,
        "gamma": 0.99,
        "gamma_clip": 0.01,
        "ppo_kl": 0.002,
        "clipfrac": 0.03,
        "entropy": 0.4,
    }
    assert list(train_progress_metrics({}, ["math"])) == [
        "reward",
        "val_math",
        "gamma",
        "gamma_clip",
        "ppo_kl",
        "clipfrac",
        "entropy",
    ]
