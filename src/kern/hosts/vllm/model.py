"""KernForCausalLM: a kern deployment as vLLM's model. vLLM schedules, caches, samples and owns
the KV memory; each forward runs the manifest's programs on vLLM's current stream.

A step: plan the calls for vLLM's batch (kern.hosts.batch), copy each call's roles from vLLM's
tensors into kern's input buffers (torch copies, on the stream), enqueue the program's launches
(kern.runtime.devices.cuda.hosted), copy its logits into one table a sequence. Everything on
the device side is torch ops and driver launches on the current stream, so vLLM's full graphs
of decode batches capture it; what is decided on the host (which programs, how many rows) comes
from vLLM's host-side metadata, which a captured decode graph fixes as vLLM does (one graph a
padded batch size, one row a sequence). The hidden states vLLM gets back are one float a row:
the row's sequence index where the row is its sequence's last, else -1; compute_logits turns
them into that sequence's logits (NaN for the others: kern computes no logits of prompt rows,
so vLLM's prompt logprobs come out NaN).

KERN_TRACE=FILE records every step vLLM runs through the model as a `kern serve --trace` file
(kern bench's workload: where vLLM's steps spend their time, `docs/vllm.md`). vLLM replays its
captured decode graphs without calling the model, so a trace sees the steps of an eager vLLM
(`--enforce-eager`) and, under graphs, only the steps vLLM runs eagerly."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context

from ...bench.trace import open_trace, write_step
from ...manifest.verify import load_verified
from ...manifest.protocol import derive
from ...runtime.engine import Engine
from ...runtime.hosted import HostMemory, adopt_states
from ..batch import HostBatch, HostError, check_protocol, plan, sources
from ..layout import HostTensor, check, host_layouts
from .backend import KERN_DTYPES, KernStateLayer
from .checks import check_config

TARGET = "sm_90a"  # the generated deployment when KERN_MANIFEST is unset


def manifest_path(cfg: VllmConfig) -> Path:
    """KERN_MANIFEST, else the deployment kern generates for the checkpoint's config.json."""
    given = os.environ.get("KERN_MANIFEST")
    if given:
        return Path(given)
    from ...deployments import deployment_for

    return deployment_for(checkpoint_folder(cfg), TARGET, context=cfg.model_config.max_model_len)


def checkpoint_folder(cfg: VllmConfig) -> Path:
    model = cfg.model_config.model
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, revision=cfg.model_config.revision,
                                  allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))


class _Device:
    """__cuda_array_interface__ over a kern buffer: torch wraps it without a copy."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3}


_TYPESTR = {"i32": "<i4", "f32": "<f4", "i64": "<i8"}


class KernForCausalLM(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        self.cfg = vllm_config
        self.v = load_verified(manifest_path(vllm_config))
        self.protocol = derive(self.v)
        check_protocol(self.protocol)
        layouts = host_layouts(self.v)
        if len(layouts) != 1:
            raise HostError(f"the deployment has {len(layouts)} paged states ({', '.join(layouts)}); kern's vLLM plugin "
                            "serves deployments of one")
        (self.layout,) = layouts.values()
        check_config(vllm_config, self.layout, self.protocol.max_positions)
        self.state = KernStateLayer(self.layout, 0)
        sched = vllm_config.scheduler_config
        self.max_seqs, self.max_rows = sched.max_num_seqs, sched.max_num_batched_tokens
        self.engine: Engine | None = None
        self.adopted = False
        given = os.environ.get("KERN_TRACE")
        self.trace = open_trace(given, self.v.manifest.model, "KERN_TRACE") if given else None

    # ---- loading -----------------------------------------------------------------------
    def load_weights(self, weights) -> set[str]:
        """kern binds the checkpoint's tensors itself, as the manifest names them (mmapped
        safetensors straight to the device); vLLM's iterator is left unread."""
        from ...runtime.devices.cuda.device import CudaDevice
        from ...runtime.devices.cuda.hosted import Enqueuer

        device = CudaDevice(arch=self.v.manifest.target.arch, ordinal=torch.cuda.current_device())
        self.engine = Engine(self.v, checkpoint_folder(self.cfg), device=device, state_budget=1)
        self.enqueuer = Enqueuer()
        dev = torch.device("cuda", torch.cuda.current_device())
        vocab = self._logits_width()
        self.logits = torch.zeros((self.max_seqs, vocab), dtype=torch.float32, device=dev)
        self.hidden = torch.full((self.max_rows + 1, 1), -1.0, dtype=torch.float32, device=dev)  # +1: a spare row
        self.arange = torch.arange(max(self.max_rows, self.max_seqs) + 1, dtype=torch.int32, device=dev)
        self.views = {st.program: self._views(st) for st in self.protocol.steppers}
        return set()

    def _logits_width(self) -> int:
        st = self.protocol.steppers[0]
        return self.engine.shapes[st.outputs["logits"]][-1]

    def _views(self, st) -> dict[str, torch.Tensor]:
        """Torch tensors over a program's role buffers, at their allocated (largest) shapes."""
        e, out = self.engine, {}
        named = {**st.inputs, **{pt.buffer: pt.buffer for pt in st.page_tables}, "logits": st.outputs["logits"]}
        for role, name in named.items():
            b = e.m.buffers[name]
            if b.dtype not in _TYPESTR:
                continue  # a role the host leaves alone (none of the ones it fills)
            shape = e.shapes[name]
            if name in {pt.buffer for pt in st.page_tables}:
                shape = (shape[0], int(np.prod(shape[1:])))
            out[role] = torch.as_tensor(_Device(e.device.address(e.buffers[name]), shape, _TYPESTR[b.dtype]),
                                        device=self.logits.device)
        return out

    def _adopt(self) -> None:
        """vLLM's KV cache tensor checked against the manifest's host layout, then adopted."""
        kv = self.state.kv_cache
        if not isinstance(kv, torch.Tensor) or kv.numel() == 0:
            raise HostError("vLLM ran a step with attention metadata before binding kern's KV cache")
        t = HostTensor(self.state.layer_name, tuple(kv.shape), tuple(kv.stride()),
                       KERN_DTYPES.get(kv.dtype, str(kv.dtype)), kv.data_ptr())
        pages = check(self.layout, t)
        adopt_states(self.engine, {self.layout.state: HostMemory(kv.data_ptr(), pages * self.layout.page_bytes, pages)})
        self.adopted = True

    # ---- the step ----------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise HostError("kern's programs embed the tokens themselves: prompt embeddings and multimodal inputs are "
                        "not supported")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds=None, **kwargs) -> torch.Tensor:
        if inputs_embeds is not None:
            self.embed_input_ids(input_ids)
        n = input_ids.shape[0]
        meta = get_forward_context().attn_metadata
        if isinstance(meta, list):
            raise HostError("vLLM split the batch into micro-batches (dbo): not supported by kern's plugin")
        meta = meta.get(self.state.layer_name) if meta else None
        if meta is None:  # vLLM's memory profile (no KV cache yet): nothing to run; logits of zeros
            return self.hidden[:n].zero_()
        if not self.adopted:
            self._adopt()
        self.step(meta.common, input_ids, positions)
        return self.hidden[:n]

    def step(self, c, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        qsl = c.query_start_loc_cpu.numpy()
        lens = np.diff(qsl[:c.num_reqs + 1])
        calls = plan(self.protocol, lens, max(int(c.max_seq_len), 1))
        stream = torch.cuda.current_stream().cuda_stream
        capturing = torch.cuda.is_current_stream_capturing()
        batch = HostBatch(input_ids, positions, c.block_table_tensor, c.seq_lens)
        end = c.query_start_loc[c.num_reqs]  # rows past it are vLLM's padding
        for call in calls:
            st, t = call.stepper, self.views[call.stepper.program]
            src = sources(call, batch, t[st.page_tables[0].buffer].shape[1] if st.page_tables else 0)
            (r0, r1), (s0, s1), g = call.rows, call.seqs, call.groups
            t["token"][:r1 - r0].copy_(src["token"])
            pos = src["position"]
            if call.uniform:  # a padded row may hold a stale position: make it 0 (its pages are vLLM's null block)
                pos = torch.where(self.arange[r0:r1] < end, pos, 0)
            t["position"][:r1 - r0].copy_(pos)
            if call.uniform:
                t["cu_seqlens"][:g + 1].copy_(self.arange[:g + 1])
            elif capturing:
                raise HostError("vLLM captured a graph of a mixed batch; kern's plugin captures uniform decode only")
            else:
                t["cu_seqlens"][:g + 1].copy_(torch.from_numpy(call.cu_seqlens()))
            for pt in st.page_tables:
                bt = src[pt.buffer]
                t[pt.buffer][:g, :bt.shape[1]].copy_(bt)
            if "seq_len" in src:
                tails = call.tails()
                t["seq_len"][:g].copy_(src["seq_len"] - torch.from_numpy(tails).to(src["seq_len"].device)
                                       if tails.any() else src["seq_len"])
            env = self.engine.env(st.program, call.vars)
            self.enqueuer.enqueue(self.engine.programs[st.program], env, stream)
            self.logits[s0:s1].copy_(t["logits"][:g])
            if self.trace is not None and not capturing:  # each piece's first position (the one sync a traced call makes)
                first = positions[[p.row0 for p in call.pieces]].tolist()
                write_step(self.trace, st.program, [p.rows for p in call.pieces], first)
        # each sequence's last row carries its index; other rows -1 (no logits)
        self.hidden.fill_(-1.0)
        seqs = c.query_start_loc[:c.num_reqs + 1]
        last = torch.where(seqs[1:] > seqs[:-1], seqs[1:] - 1, self.hidden.shape[0] - 1)
        self.hidden.index_put_((last.long(), torch.zeros_like(last, dtype=torch.long)),
                               self.arange[:c.num_reqs].to(torch.float32))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        idx = hidden_states[:, 0]
        out = self.logits.index_select(0, idx.clamp(min=0).long())
        return out.masked_fill_((idx < 0)[:, None], float("nan"))
