"""A worker's output: captured in its folder (``output.log``, appended to by each start),
and read back for the words of a failed GPU allocation (``device_out_of_memory``), which
make the agent report the end as out of memory."""
from __future__ import annotations

import sys

import pytest

from gpusched_node_agent.runner import OUTPUT_TAIL, ProcessRun, device_out_of_memory

PYTORCH = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
           "capacity of 79.11 GiB of which 1.02 GiB is free.")


@pytest.mark.parametrize("text, found", [
    (PYTORCH, "CUDA out of memory"),
    ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", "CUDA error: out of memory"),
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 20.00 MiB", "HIP out of memory"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "CUBLAS_STATUS_ALLOC_FAILED"),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes",
     "RESOURCE_EXHAUSTED: Out of memory"),
    ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor",
     "ResourceExhaustedError: OOM when allocating"),
    ("ValueError: expected 3 dimensions, got 2", ""),
    ("loss 0.31 memory 71 GiB of 80 GiB", ""),
])
def test_the_words_of_a_failed_gpu_allocation_are_found(tmp_path, text, found):
    log = tmp_path / "output.log"
    log.write_text(f"step 1\n{text}\n")
    assert device_out_of_memory(log) == found


def test_only_the_tail_is_read_and_a_missing_file_says_nothing(tmp_path):
    log = tmp_path / "output.log"
    log.write_bytes(PYTORCH.encode() + b"\n" + b"x" * OUTPUT_TAIL)   # the error scrolled out of the tail
    assert device_out_of_memory(log) == ""
    assert device_out_of_memory(tmp_path / "missing.log") == ""


async def test_a_workers_output_goes_to_its_folder_attempt_after_attempt(tmp_path):
    script = "import sys; print('to stdout', flush=True); sys.stderr.write('" + PYTORCH + "\\n'); sys.exit(1)"
    for _ in range(2):
        run = ProcessRun((sys.executable, "-c", script), {}, tmp_path / "job-0-0")
        run.POLL_S = 0.05
        await run.start()
        end = await run.wait()
        assert end.exit_code == 1
    text = (tmp_path / "job-0-0" / "output.log").read_text()
    assert text.count("to stdout") == 2 and text.count("CUDA out of memory") == 2
    assert device_out_of_memory(run.output_file) == "CUDA out of memory"
