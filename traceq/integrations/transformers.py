"""`TraceqCallback`: `traceq.profile` for `transformers`' `Trainer`.

    from traceq.integrations.transformers import TraceqCallback

    trainer = Trainer(model, args, train_dataset=..., callbacks=[TraceqCallback("traces/")])
    trainer.train()  # traces/rank-0.pt.trace.json.gz and rank-0.et.json.gz

The profiler starts when training begins and steps with each optimizer step, on its
schedule (by default: skip 1 step, warm up 1, record 3), every rank under its own name;
when training ends it prints the command that analyzes what it wrote. Needs the `hf`
extra (`pip install 'traceq[hf]'`): this module imports `transformers`, `traceq` does not.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from transformers import TrainerCallback

from traceq.recording import profile


class TraceqCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    """Profile a `Trainer`'s steps into `dir`: `options` as `traceq.profile`'s (`wait`,
    `warmup`, `active`, `repeat`, `record_shapes`, `with_stack`, `with_modules`,
    `profile_memory`, `execution_trace`, ...)."""

    def __init__(self, dir: str, **options: Any) -> None:
        self.dir = dir
        self.options = options
        self.prof: Any = None
        self._stack: ExitStack | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack = ExitStack()
        self.prof = self._stack.enter_context(profile(self.dir, **self.options))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.prof is not None:
            self.prof.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @property
    def recording(self) -> Any:
        """What was written (`traceq.recording.Recording`), once training has ended."""
        return getattr(self.prof, "recording", None)
