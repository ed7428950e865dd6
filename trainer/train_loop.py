"""The training steps: batches in, the compiled step, logging, checkpoints, and a preemption's orderly stop.

At most two steps are in flight (a batch's buffer is reused once its step is done); every `log_every` steps the
loss, the learning rate, the speed and the share of time spent waiting for input are logged, with what would help
where the input holds the accelerators back. Set-up is `run_setup`; evaluation and export after the loop, `train`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from trainer import run_setup
from trainer.engine import placement, plateau, run_files
from trainer.parallel import distributed


def loop(run: run_setup.Run, log: Callable[[str], None]) -> float:
    """The training steps from `run.start_step` on; returns their seconds.

    Raises:
        distributed.Preempted: at a preemption notice, after the checkpoint of the step every process reached.
    """
    import jax

    config, task, image_shape, total_steps = (run.resolved.config, run.resolved.task, run.resolved.image_shape,
                                              run.resolved.total_steps)
    distribution = run.distribution
    train_step = run.train_step
    image_sharding = distribution.get_data_layout(image_shape).backend_layout
    log(f"each device holds a {tuple(image_sharding.shard_shape(tuple(image_shape)))} shard of every {tuple(image_shape)} "
        f"batch (input_partition_dims {','.join(map(str, config.partition.input_partition_dims))})")
    share = placement.process_share(image_sharding, image_shape) if jax.process_count() > 1 else None
    if share is not None and share.depth is not None:
        log(f"process {jax.process_index()} reads depths {share.depth[0]}-{share.depth[1] - 1} of rows "
            f"{','.join(map(str, share.rows))} of every batch")
    batches = task.batches(run.start_step, share, log)
    state, history = run.state, run.history
    in_flight = collections.deque()  # (host batch, its step's metrics): its buffer is reused once the step is done

    started = time.perf_counter()
    window, compiled_at, watch = _Window(started), None, plateau.PlateauWatch()  # watch: a plateau, said once
    try:
        for step_number in range(run.start_step, total_steps):
            waiting = time.perf_counter()
            batch = next(batches)
            waited_now = time.perf_counter() - waiting
            window.input_wait += waited_now
            if compiled_at is not None:
                run.input_wait_seconds += waited_now
            inputs, labels = task.place(distribution, batch, share)
            state, step_metrics = train_step(state, inputs, labels, np.int32(step_number))
            compiled_at = compiled_at or time.perf_counter()  # the run's input wait is judged after the compile
            in_flight.append((batch, step_metrics))
            while len(in_flight) > 1:  # at most this step and the next in flight; the one before is done with its input
                done_batch, done_metrics = in_flight.popleft()
                jax.block_until_ready(done_metrics)
                done_batch.release()
            done = step_number + 1
            window.steps += 1
            if done % config.log_every == 0 or done == total_steps:
                loss = float(step_metrics["loss"])
                if not math.isfinite(loss):
                    raise FloatingPointError(
                        f"the loss became {loss} at step {done}; lower the learning rate (now {config.learning_rate}) "
                        "or use precision float32."
                    )
                rate, waited = window.close(time.perf_counter())
                learning_rate = float(run.schedule(step_number))
                history.append({"step": done, "loss": loss, "learning_rate": learning_rate,
                                "input_wait": round(waited, 4)})
                log(f"step {done}/{total_steps}  loss {loss:.4f}  lr {learning_rate:.2e}  {rate:.2f} steps/s  "
                    f"input wait {waited:.0%}{_input_bound_note(waited, batches)}")
                if "class_dice" in step_metrics and (stalled := watch.observe(done, loss, step_metrics["class_dice"])):
                    log(stalled)
                if run.writer is not None:
                    run.writer.scalars(done, {"loss": loss, "learning_rate": learning_rate,
                                              "grad_norm": float(step_metrics["grad_norm"]),
                                              "input_wait_fraction": waited})
            # Read after the step's log, which waits for the step: a Ctrl-C or SIGTERM while it ran stops the run
            # after it. Read before, it let the next step start too, and "finishing this step" ran two.
            preempted = distributed.preemption_reached(done)  # the same step on every process
            if preempted or done % config.checkpoint_every == 0 or done == total_steps:
                if run.is_chief:
                    # History first: a run killed between the two resumes from the older checkpoint and drops the
                    # newer lines, whereas the other order would resume past lines that were never written.
                    run_files.write_history(config.output_dir, history)
                run.checkpointer.save(done, state)  # every process writes its part
            if preempted and done < total_steps:
                run.checkpointer.close()
                log(f"preemption notice: stopped after step {done}, checkpoint written")
                raise distributed.Preempted(done)
        for done_batch, done_metrics in in_flight:
            jax.block_until_ready(done_metrics)
            done_batch.release()
        run.checkpointer.close()
        run.input_cache = getattr(batches, "cache_reason", None)  # the CT input says whether it caches, and why
    finally:
        batches.close()  # the reading threads stop (a generator's close, for detection)
    run.state = state
    finished = time.perf_counter()
    run.input_wait_fraction = run.input_wait_seconds / (finished - compiled_at) if compiled_at else 0.0
    return finished - started


INPUT_BOUND = 0.5  # a logging window that waited for input this much of its time is input-bound


def _input_bound_note(waited: float, batches) -> str:
    """', input-bound: ...' with what would help, when the window waited for input `INPUT_BOUND` of its time."""
    if waited < INPUT_BOUND:
        return ""
    helps = ["more host cores"]
    if getattr(batches, "cached", True) is False:
        helps.append("the input cache (--input-cache on, if the data set fits in memory)")
    if getattr(getattr(batches, "records", None), "compressed", False):
        helps.append("uncompressed records (fullres preprocess without --compress)")
    return f" (input-bound: the accelerators waited for input; {', or '.join(helps)} would help)"


@dataclasses.dataclass
class _Window:
    """One logging window: its start, steps, and the seconds the loop waited for input in it."""

    start: float
    steps: int = 0
    input_wait: float = 0.0

    def close(self, now: float) -> tuple[float, float]:
        """(steps per second, fraction of the window spent waiting for input); starts the next window."""
        seconds = max(now - self.start, 1e-9)
        result = (self.steps / seconds, min(1.0, self.input_wait / seconds))
        self.start, self.steps, self.input_wait = now, 0, 0.0
        return result
