"""The per-thread work tensors (runtime/workspace.py)."""

from __future__ import annotations

import threading

import torch

from tl_geometry.runtime.workspace import Workspace


def test_a_name_reuses_its_buffer_and_grows_when_asked_for_more():
    work = Workspace()
    first = work.get("a", (3, 4), torch.float32, torch.device("cpu"))
    first.fill_(1.0)
    smaller = work.get("a", (2, 5), torch.float32, torch.device("cpu"))
    assert smaller.shape == (2, 5) and smaller.data_ptr() == first.data_ptr()
    assert torch.equal(smaller.reshape(-1), torch.ones(10))  # the same memory, not a new tensor
    other = work.get("b", (3, 4), torch.float32, torch.device("cpu"))
    assert other.data_ptr() != first.data_ptr()
    assert work.get("a", (3, 4), torch.float64, torch.device("cpu")).data_ptr() != first.data_ptr()
    larger = work.get("a", (5, 5), torch.float32, torch.device("cpu"))
    assert larger.shape == (5, 5) and larger.is_contiguous()


def test_threads_get_their_own_buffers_writable_in_inference_mode():
    work = Workspace()
    mine = work.get("a", (4,), torch.float32, torch.device("cpu"))
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(work.get("a", (4,), torch.float32, torch.device("cpu"))))
    thread.start()
    thread.join()
    assert theirs[0].data_ptr() != mine.data_ptr()
    with torch.inference_mode():
        buffer = work.get("fresh", (3,), torch.float32, torch.device("cpu"))
    assert not buffer.is_inference()
    buffer.add_(1.0)  # writable outside inference mode too
