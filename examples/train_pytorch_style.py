"""A PyTorch-style training loop that reports to Gantry through ``gantry_sdk``.

It runs anywhere: without torch the model, data loader and all-reduce are fakes that sleep
for as long as real work would take; with ``--torch`` (and torch installed) the model is a
tiny ``torch.nn.Linear``. Outside Gantry (no ``GANTRY_API_URL`` / ``GANTRY_ATTEMPT_TOKEN``)
reporting is off and the loop trains as usual.

What it shows:

* resuming from ``GANTRY_RESUME_FROM`` / ``GANTRY_RESUME_STEP`` (``checkpoint_restored``);
* the runtime environment at start, ``ready`` once set up;
* step windows with the time spent waiting on data and on communication (``StepTimer``);
* periodic checkpoints (``checkpoint_saved``);
* a checkpoint before preemption or timeout: SIGUSR1 (Slurm ``--signal=B:USR1@120``) or
  SIGTERM (Kubernetes, ``terminationGracePeriodSeconds``) set a flag; the loop checkpoints
  at the next step boundary, reports, flushes and exits with 128 + the signal number.

    PYTHONPATH=sdk python examples/train_pytorch_style.py --steps 200 --checkpoint-every 50
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time

try:  # the SDK next to this file in the repository, when it is not installed
    import gantry_sdk
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk"))
    import gantry_sdk


# --- a fake of the pieces of a PyTorch training script -----------------------------------


class FakeDataset:
    """A map-style dataset of ``size`` samples."""

    def __init__(self, size, seed=0):
        self.size = size
        self.seed = seed

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        rng = random.Random(self.seed * 1_000_003 + index)
        x = [rng.uniform(-1, 1) for _ in range(4)]
        return x, sum(x) * 0.5


class FakeDataLoader:
    """Batches of a dataset, in a shuffled order per epoch; ``load_seconds`` is how long
    fetching a batch blocks (a slow filesystem, too few workers)."""

    def __init__(self, dataset, batch_size, load_seconds=0.0, seed=0):
        self.dataset = dataset
        self.batch_size = batch_size
        self.load_seconds = load_seconds
        self.epoch = 0
        self.seed = seed

    def __len__(self):
        return max(1, len(self.dataset) // self.batch_size)

    def __iter__(self):
        order = list(range(len(self.dataset)))
        random.Random(self.seed + self.epoch).shuffle(order)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            if self.load_seconds:
                time.sleep(self.load_seconds)
            yield [self.dataset[i] for i in order[start : start + self.batch_size]]


class FakeModel:
    """A linear model with plain-Python parameters and gradients."""

    def __init__(self, width=4, compute_seconds=0.0):
        self.weights = [0.0] * width
        self.grads = [0.0] * width
        self.compute_seconds = compute_seconds

    def forward(self, batch):
        if self.compute_seconds:
            time.sleep(self.compute_seconds / 2)  # the forward pass
        loss = 0.0
        self.grads = [0.0] * len(self.weights)
        for x, y in batch:
            error = sum(w * xi for w, xi in zip(self.weights, x)) - y  # noqa: B905 (3.8)
            loss += error * error / len(batch)
            for i, xi in enumerate(x):
                self.grads[i] += 2 * error * xi / len(batch)
        return loss

    def backward(self):
        if self.compute_seconds:
            time.sleep(self.compute_seconds / 2)  # the backward pass

    def state_dict(self):
        return {"weights": list(self.weights)}

    def load_state_dict(self, state):
        self.weights = list(state["weights"])


class FakeSGD:
    def __init__(self, model, lr):
        self.model = model
        self.lr = lr

    def zero_grad(self):
        pass

    def step(self):
        pairs = zip(self.model.weights, self.model.grads)  # noqa: B905 (strict= is 3.10+)
        self.model.weights = [w - self.lr * g for w, g in pairs]

    def state_dict(self):
        return {"lr": self.lr}

    def load_state_dict(self, state):
        self.lr = state["lr"]


def all_reduce_gradients(model, comm_seconds):
    """Where DDP would all-reduce the gradients over NCCL; here a sleep."""
    if comm_seconds:
        time.sleep(comm_seconds)


# --- checkpoints --------------------------------------------------------------------------


def checkpoint_path(uri):
    return uri[len("file://") :] if uri.startswith("file://") else uri


def save_checkpoint(directory, step, model, optimizer):
    """Write atomically (a temporary file, then rename); return the checkpoint's URI."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.abspath(os.path.join(directory, f"step-{step:08d}.json"))
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with open(path + ".tmp", "w") as handle:
        json.dump(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)
    return "file://" + path


def load_checkpoint(uri, model, optimizer):
    with open(checkpoint_path(uri)) as handle:
        state = json.load(handle)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


# --- preemption ---------------------------------------------------------------------------


class Preemption:
    """SIGUSR1 / SIGTERM only set a flag: checkpointing inside a signal handler could
    interrupt a half-written optimizer step. The loop checks the flag between steps."""

    def __init__(self):
        self.signum = None
        for name in ("SIGUSR1", "SIGTERM"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), self._handle)

    def _handle(self, signum, frame):
        self.signum = signum

    @property
    def requested(self):
        return self.signum is not None


# --- the training script ------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps; 0: never")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    parser.add_argument("--compute-seconds", type=float, default=0.02, help="per step")
    parser.add_argument("--data-seconds", type=float, default=0.005, help="per batch")
    parser.add_argument("--comm-seconds", type=float, default=0.003, help="per step")
    parser.add_argument("--window-seconds", type=float, default=30.0, help="step windows")
    parser.add_argument("--torch", action="store_true", help="use torch if importable")
    return parser.parse_args(argv)


def build(args):
    if args.torch:
        try:
            import torch  # noqa: F401 (only to show the runtime report picks it up)
        except ImportError:
            print("torch is not installed: using the fake model", file=sys.stderr)
    model = FakeModel(compute_seconds=args.compute_seconds)
    optimizer = FakeSGD(model, lr=args.lr)
    loader = FakeDataLoader(
        FakeDataset(size=64 * args.batch_size), args.batch_size, load_seconds=args.data_seconds
    )
    return model, optimizer, loader


def main(argv=None):
    args = parse_args(argv)
    preemption = Preemption()
    reporter = gantry_sdk.Reporter.from_env()
    reporter.runtime_env()  # in the background: driver, CUDA, NCCL, torch, host, GPUs

    model, optimizer, loader = build(args)
    step = 0
    if reporter.resume_uri:
        started = time.perf_counter()
        try:
            step = load_checkpoint(reporter.resume_uri, model, optimizer)
        except (OSError, ValueError, KeyError) as exc:
            # The variables still tell where the run got to; better to stop loudly than to
            # silently train from scratch over a run that had progressed.
            print(f"cannot load {reporter.resume_uri}: {exc}", file=sys.stderr)
            return 1
        reporter.checkpoint_restored(step, reporter.resume_uri, time.perf_counter() - started)
        print(f"resumed from step {step}", file=sys.stderr)
    elif reporter.resume_step:
        print(
            f"GANTRY_RESUME_STEP={reporter.resume_step} but no GANTRY_RESUME_FROM", file=sys.stderr
        )

    reporter.ready()
    timer = reporter.step_timer(window_seconds=args.window_seconds, step=step)

    def checkpoint():
        with timer.checkpoint():
            started = time.perf_counter()
            uri = save_checkpoint(args.checkpoint_dir, step, model, optimizer)
            seconds = time.perf_counter() - started
        reporter.checkpoint_saved(step, uri, seconds)
        return uri

    batches = iter(())
    while step < args.steps:
        with timer.step():
            with timer.data():
                batch = next(batches, None)
                if batch is None:  # the end of an epoch
                    loader.epoch += 1
                    batches = iter(loader)
                    batch = next(batches)
            optimizer.zero_grad()
            loss = model.forward(batch)
            model.backward()
            with timer.comm():
                all_reduce_gradients(model, args.comm_seconds)
            optimizer.step()
        step += 1
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            checkpoint()
        if preemption.requested:
            already = args.checkpoint_every and step % args.checkpoint_every == 0
            uri = None if already else checkpoint()
            timer.flush()
            reporter.flush(timeout=10)
            name = signal.Signals(preemption.signum).name
            print(
                f"{name}: checkpointed step {step} at {uri or 'the last checkpoint'}",
                file=sys.stderr,
            )
            return 128 + preemption.signum
    timer.flush()
    print(f"done: step {step}, loss {loss:.4f}", file=sys.stderr)
    reporter.close(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
