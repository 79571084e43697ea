"""Transport encoding: typed frames, zero-copy arrays through real sockets, no pickle."""

from __future__ import annotations

import pickle

import msgspec
import numpy as np
import pytest
import torch
import zmq

from omnix.events.types import StageParams
from omnix.pipelines.config import ScriptedArgs, StageConfig
from omnix.transport import messages as m
from omnix.transport.codec import ARRAY_FRAME_THRESHOLD, FrameDecoder, FrameEncoder
from omnix.transport.sockets import recv_parts
from omnix.transport.work import InputPiece, WorkItem


class Payload(msgspec.Struct):
    name: str
    array: np.ndarray | None = None
    tensor: torch.Tensor | None = None


@pytest.fixture
def no_pickle(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("pickle was used")

    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, refuse)


def _roundtrip(
    router: zmq.Socket, dealer: zmq.Socket, obj: object, type_: type
) -> tuple[object, list]:
    frames = FrameEncoder().encode(b"T", obj)
    dealer.send_multipart(frames, copy=False)
    assert router.poll(5000)
    identity = router.recv()
    mtype, body, aux = recv_parts(router)
    assert (identity, mtype) == (b"w1", b"T")
    return FrameDecoder(type_).decode(body, aux), frames


def test_8mb_numpy_and_torch_roundtrip_bit_exact_zero_copy(pair, no_pickle):
    router, dealer = pair
    rng = np.random.default_rng(0)
    arr = rng.standard_normal(1 << 20)  # 8 MiB of float64
    ten = torch.from_numpy(rng.standard_normal(1 << 21).astype(np.float32))  # 8 MiB
    out, frames = _roundtrip(router, dealer, Payload("big", arr, ten), Payload)
    assert len(frames) == 4  # type, body, one frame per array
    assert len(frames[1]) < 200  # the body holds no array bytes
    assert out.array.dtype == arr.dtype and out.array.shape == arr.shape
    assert out.array.tobytes() == arr.tobytes()
    assert out.tensor.dtype == torch.float32 and torch.equal(out.tensor, ten)
    # Rebuilt over the received frame, not copied: numpy does not own it.
    assert not out.array.flags.owndata
    assert out.tensor.untyped_storage().nbytes() == ten.nbytes


def test_bfloat16_and_shapes_and_small_arrays_inline(pair, no_pickle):
    router, dealer = pair
    ten = torch.arange(ARRAY_FRAME_THRESHOLD, dtype=torch.float32).to(torch.bfloat16).reshape(4, -1)
    out, frames = _roundtrip(router, dealer, Payload("bf", None, ten), Payload)
    assert out.tensor.dtype == torch.bfloat16 and torch.equal(out.tensor, ten) and len(frames) == 3
    small = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]  # non-contiguous view
    out, frames = _roundtrip(router, dealer, Payload("s", small, torch.ones(3)), Payload)
    assert len(frames) == 2  # both inline: below the threshold
    assert np.array_equal(out.array, small) and torch.equal(out.tensor, torch.ones(3))
    out, _ = _roundtrip(
        router, dealer, Payload("empty", np.zeros((0, 3)), torch.zeros(0, 2)), Payload
    )
    assert out.array.shape == (0, 3) and tuple(out.tensor.shape) == (0, 2)


def test_work_item_with_array_piece_roundtrips(pair, no_pickle):
    router, dealer = pair
    audio = np.linspace(-1, 1, 100_000, dtype=np.float32)
    item = WorkItem(
        "r1",
        "code2wav",
        1,
        3,
        True,
        (InputPiece(array=audio, modality="audio"), InputPiece(text="hi")),
        StageParams(temperature=0.5),
        7,
    )
    out, frames = _roundtrip(router, dealer, item, WorkItem)
    assert len(frames) == 3
    assert out.pieces[0].array.tobytes() == audio.tobytes()
    assert msgspec.structs.replace(out, pieces=()) == msgspec.structs.replace(item, pieces=())
    assert out.pieces[1] == item.pieces[1]


def test_output_records_and_stage_config_decode_typed(no_pickle):
    enc = FrameEncoder()
    recs = [
        m.Started("r"),
        m.Output("r", 0, "audio", array=np.ones(4, np.float32)),
        m.ProgressRec("r", 1, 2),
        m.Done("r", 1, "stop", 3, 4),
        m.Error("q", "boom"),
    ]
    frames = enc.encode(m.OUTPUTS, recs)
    dec = m.decoders(m.SERVER_BOUND)[m.OUTPUTS]
    out = dec.decode(frames[1])
    assert [type(r) for r in out] == [type(r) for r in recs]
    assert np.array_equal(out[1].array, recs[1].array)
    cfg = StageConfig(name="s", engine=ScriptedArgs(chunks_per_piece=2), replicas=2)
    w = m.Welcome(1, cfg, "p", 0.5, 10.0)
    got = m.decoders(m.WORKER_BOUND)[m.WELCOME].decode(enc.encode(m.WELCOME, w)[1])
    assert got == w and isinstance(got.config.engine, ScriptedArgs)


def test_unencodable_values_are_refused_not_pickled(no_pickle):
    enc = FrameEncoder()
    with pytest.raises(TypeError, match="never pickles"):
        enc.encode(b"T", Payload("x", array=None, tensor=None).__class__("x", object()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pickle"):
        enc.encode(b"T", Payload("x", np.array([object()], dtype=object)))
    with pytest.raises(msgspec.DecodeError):
        FrameDecoder(Payload).decode(b"\x93\x01\x02")  # garbage for the type
    bad = msgspec.msgpack.encode({"name": "x", "array": ["<f4", [1], 5]})
    with pytest.raises(msgspec.ValidationError, match="frame 5"):
        FrameDecoder(Payload).decode(bad, [b"abcd"])
