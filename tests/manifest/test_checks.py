"""What `kern verify` checks, one class at a time (docs/architecture.md, "What kern verify checks").

Each test takes the tiny generated llama manifest (conftest.py), breaks it exactly one way,
and shows the problem the verifier names: its place (`where`) and a key phrase of `what`.
Read top to bottom, this file is the list of checks."""

from __future__ import annotations

import json

import pytest

from kern.manifest.verify import Verified, verify_text

from .conftest import problems


def reported(m, where: str, phrase: str) -> None:
    """Assert verify reports a problem at exactly `where` whose text contains `phrase`."""
    found = problems(m)
    assert found, "the broken manifest verified"
    assert not [p for p in found if "internal error" in p.what], found
    hits = [p for p in found if p.where == where and phrase in p.what]
    assert hits, f"no problem at {where!r} with {phrase!r}; got:\n" + "\n".join(map(str, found))


def call_index(m, program: str, op: str, nth: int = 0) -> int:
    """Index of the nth call of `op` in a program."""
    return [i for i, c in enumerate(m["programs"][program]["calls"]) if c["op"] == op][nth]


def test_the_fixture_is_valid(m):
    r = verify_text(json.dumps(m))
    assert r.problems == []
    assert isinstance(r.verified, Verified)


def test_only_the_verifier_makes_a_verified_manifest(m):
    r = verify_text(json.dumps(m))
    with pytest.raises(TypeError, match="only from"):
        Verified(r.verified.manifest, {}, {}, r.verified.base_dir)


# 1. schema: version, unknown fields, duplicate names, malformed type strings ----------------

def test_1_schema_version(m):
    m["schema_version"] = 2
    reported(m, "schema_version", "Input should be 1")


def test_1_unknown_field(m):
    m["buffers"]["d_x"]["colour"] = "red"
    reported(m, "buffers.d_x.colour", "unknown field")


def test_1_missing_field(m):
    del m["buffers"]["d_x"]["dtype"]
    reported(m, "buffers.d_x.dtype", "missing required field")


def test_1_wrong_type_is_not_coerced(m):
    m["vars"]["tokens"]["max"] = "256"  # a string is not an integer, even when it reads like one
    reported(m, "vars.tokens.max", "valid integer")
    m["vars"]["tokens"]["max"] = True  # nor is JSON true
    reported(m, "vars.tokens.max", "valid integer")


def test_1_duplicate_names(m):
    text = json.dumps(m).replace('"buffers": {', '"buffers": {"d_x": {"kind": "workspace", "dtype": "f32", '
                                 '"shape": [1]}, ', 1)
    reported(text, "buffers.d_x", "duplicate name 'd_x'")


def test_1_buffer_and_state_share_a_name(m):
    m["states"]["d_x"] = m["states"]["kv"]
    reported(m, "states.d_x", "duplicate name 'd_x'")


def test_1_malformed_param_type(m):
    m["ops"]["linear"]["params"][2] = "y: out buffer<f33>"
    reported(m, "ops.linear.params[2]", "unknown dtype 'f33'")
    m["ops"]["linear"]["params"][2] = "y out buffer<f32>"
    reported(m, "ops.linear.params[2]", "malformed param")


def test_1_duplicate_param_name(m):
    m["ops"]["linear"]["params"][1] = "x: in buffer<f32>"
    reported(m, "ops.linear.params[1]", "duplicate param name 'x'")


def test_1_cuda_target_names_its_arch(m):
    m["target"] = {"device": "cuda"}
    reported(m, "target.arch", "sm_90a")


# 2. vars have max >= 1; constants and vars do not collide; expressions resolve -------------

def test_2_var_max_below_one(m):
    m["vars"]["tokens"]["max"] = 0
    reported(m, "vars.tokens.max", "must be >= 1, got 0")


def test_2_constant_collides_with_var(m):
    m["constants"]["seqs"] = 4
    reported(m, "vars.seqs", "a constant has the same name")


def test_2_constant_cycle(m):
    m["constants"]["hidden"] = {"mul": ["q_dim", 1]}
    m["constants"]["q_dim"] = {"mul": ["heads", "hidden"]}
    reported(m, "constants.hidden", "cycle: hidden -> q_dim -> hidden")
    reported(m, "buffers.d_x.shape[1]", "constant 'hidden' does not resolve")


def test_2_unknown_name_in_expression(m):
    m["buffers"]["d_x"]["shape"][1] = "hiden"
    reported(m, "buffers.d_x.shape[1]", "unknown name 'hiden'")


# 3. buffers: shapes resolve, sizes do not overflow, fills and domains are right ------------

def test_3_shape_overflows_at_the_var_bounds(m):
    m["buffers"]["d_x"]["shape"] = ["seqs", 2**62]
    reported(m, "buffers.d_x", "overflows a 64-bit size")


def test_3_shape_is_zero_at_the_var_minima(m):
    m["buffers"]["d_x"]["shape"][0] = {"add": ["seqs", -1]}
    reported(m, "buffers.d_x.shape[0]", "must be >= 1 at the var minima, got 0")


def test_3_fill_on_the_wrong_kind(m):
    m["buffers"]["d_x"]["fill"] = "token"
    reported(m, "buffers.d_x.fill", "role 'token' belongs on an input buffer, not workspace")


def test_3_fill_on_the_wrong_dtype(m):
    m["buffers"]["d_logits"]["fill"] = "tokens"
    reported(m, "buffers.d_logits.fill", "role 'tokens' needs dtype i32, got f32")


def test_3_domain_on_floats(m):
    m["buffers"]["d_x"]["kind"] = "input"
    m["buffers"]["d_x"]["domain"] = {"range": [0, 1]}
    reported(m, "buffers.d_x.domain", "a domain bounds integer values")


def test_3_empty_domain(m):
    m["buffers"]["d_pos"]["domain"] = {"range": ["context", 0]}
    reported(m, "buffers.d_pos.domain.range", "can be empty")


def test_3_page_table_into_a_missing_state(m):
    m["buffers"]["d_page_table"]["domain"]["index_into"] = "kvv"
    reported(m, "buffers.d_page_table.domain.index_into", "no state named 'kvv'")


def test_3_fallback_naming_its_own_tensor(m):
    m["buffers"]["lm_head"]["bind"] = [{"tensor": "lm_head.weight", "fallback": "lm_head.weight"}]
    reported(m, "buffers.lm_head.bind[0].fallback", "names the segment's own tensor 'lm_head.weight'")


# 4. states declare exactly one size -------------------------------------------------------

def test_4_state_with_two_sizes(m):
    m["states"]["kv"]["bytes"] = 1024
    reported(m, "states.kv", "exactly one of bytes_per_token, bytes_per_seq, bytes")


# 5. modules: a 64-hex sha256, a well-formed source, every module used ---------------------

def test_5_bad_sha256(m):
    m["modules"]["kernels"]["sha256"] = "ABC123"
    reported(m, "modules.kernels.sha256", "64 lowercase hex digits")


def test_5_source_leaves_the_folder(m):
    m["modules"]["kernels"]["source"] = "../elsewhere/kernels.py"
    reported(m, "modules.kernels.source", "stay inside its folder")


def test_5_source_over_plain_http(m):
    m["modules"]["kernels"]["source"] = "http://example.com/k.py"
    reported(m, "modules.kernels.source", "only https:// URLs")


def test_5_unused_module(m):
    m["modules"]["spare"] = dict(m["modules"]["kernels"])
    reported(m, "modules.spare", "declared and unused")


# 6. launches: module exists, geometry fits the device, args name params -------------------

def test_6_launch_names_a_missing_module(m):
    m["ops"]["linear"]["impl"]["launches"][0]["module"] = "kernelz"
    reported(m, "ops.linear.impl.launches[0].module", "no module named 'kernelz'")


def test_6_block_too_large_on_cuda(m):
    m["target"] = {"device": "cuda", "arch": "sm_90a"}
    m["ops"]["linear"]["impl"]["launches"][0]["block"] = [2048]
    reported(m, "ops.linear.impl.launches[0].block[0]", "is 2048; the device allows 1024")


def test_6_grid_zero_at_the_var_minima(m):
    m["ops"]["linear"]["impl"]["launches"][0]["grid"] = [{"add": ["tokens", -1]}]
    reported(m, "ops.linear.impl.launches[0].grid[0]", "is 0 at the var minima")


def test_6_grid_from_a_scalar_param_is_checked_per_call(m):
    m["target"] = {"device": "cuda", "arch": "sm_90a"}
    m["ops"]["rope"]["impl"]["launches"][0]["grid"] = [1, {"mul": ["heads", 100000]}]
    i = call_index(m, "decode", "rope")
    reported(m, f"programs.decode.calls[{i}] (op rope) launch 0 grid[1]", "is 400000; the device allows 65535")


def test_6_shared_memory_over_the_limit(m):
    m["target"] = {"device": "cuda", "arch": "sm_90a"}
    m["ops"]["linear"]["impl"]["launches"][0]["shared_mem"] = {"mul": ["tokens", 1024]}
    reported(m, "ops.linear.impl.launches[0].shared_mem", "262144 bytes at the var maxima; the device allows")


def test_6_launch_arg_names_a_missing_param(m):
    m["ops"]["linear"]["impl"]["launches"][0]["args"] = ["x", "w", "z"]
    reported(m, "ops.linear.impl.launches[0].args[2]", "no param named 'z'")


def test_6_extern_has_no_geometry(m):
    m["ops"]["linear"]["impl"]["launches"][0] = {"entry": "extern:cublaslt_bf16_tn", "grid": [4],
                                                 "args": ["x", "w", "y", {"value": 1}, {"value": 1}, {"value": 1}]}
    reported(m, "ops.linear.impl.launches[0].grid", "no geometry")


# 7. op dataflow: no write through an in param; every out param written --------------------

def test_7_write_through_an_in_param(m):
    m["ops"]["linear"]["impl"]["launches"][0]["writes"] = ["x", "y"]
    reported(m, "ops.linear.impl.launches[0].writes", "writes through param 'x', declared in buffer<f32>")


def test_7_tiles_only_a_buffer_the_launch_reads(m):
    m["ops"]["linear"]["impl"]["launches"][0]["tiles"] = {"y": [32, 64]}
    reported(m, "ops.linear.impl.launches[0].tiles.y", "reads in tiles only a buffer param it is passed and does not write")


def test_7_tiles_in_boxes_a_tensor_map_takes(m):
    m["ops"]["linear"]["impl"]["launches"][0]["tiles"] = {"w": [32, 64]}  # f32: 256 bytes a box row
    reported(m, "ops.linear.impl.launches[0].tiles.w", "box [32, 64]: [rows, elements], 1 to 256 rows of at most 128")


def test_7_out_param_never_written(m):
    m["ops"]["linear"]["impl"]["launches"][0]["writes"] = []
    reported(m, "ops.linear.params[2]", "out param 'y' is never written by a launch")


# 8. calls match the op signature; scalars fit; views in bounds -----------------------------

def test_8_wrong_arity(m):
    i = call_index(m, "decode", "linear")
    m["programs"]["decode"]["calls"][i]["args"].pop()
    reported(m, f"programs.decode.calls[{i}] (op linear)", "op takes 3 args (x, w, y), got 2")


def test_8_dtype_mismatch(m):
    i = call_index(m, "decode", "rms_norm")
    m["programs"]["decode"]["calls"][i]["args"][0] = {"buf": "d_next"}
    reported(m, f"programs.decode.calls[{i}] (op rms_norm) arg 0", "expects in buffer<f32>, got buffer 'd_next' of i32")


def test_8_buffer_where_a_scalar_goes(m):
    i = call_index(m, "decode", "rms_norm")
    m["programs"]["decode"]["calls"][i]["args"][3] = {"buf": "d_x"}
    reported(m, f"programs.decode.calls[{i}] (op rms_norm) arg 3", "expects f32, got buffer 'd_x'")


def test_8_missing_buffer(m):
    i = call_index(m, "decode", "linear")
    m["programs"]["decode"]["calls"][i]["args"][0] = {"buf": "nowhere"}
    reported(m, f"programs.decode.calls[{i}] (op linear) arg 0", "no buffer named 'nowhere'")


def test_8_scalar_out_of_range_at_the_var_maxima(m):
    i = call_index(m, "decode", "rope")
    m["programs"]["decode"]["calls"][i]["args"][3] = {"value": {"mul": ["context", 2**30]}}
    reported(m, f"programs.decode.calls[{i}] (op rope) arg 3", "at the var maxima does not fit i32")


def test_8_float_for_an_integer_scalar(m):
    i = call_index(m, "decode", "rope")
    m["programs"]["decode"]["calls"][i]["args"][3] = {"value": 2.5}
    reported(m, f"programs.decode.calls[{i}] (op rope) arg 3", "expects an integer i32, got 2.5")


def test_8_view_out_of_bounds(m):
    i = call_index(m, "decode", "linear")
    m["programs"]["decode"]["calls"][i]["args"][0] = {"buf": "d_h", "offset": 64, "shape": ["seqs", "hidden"]}
    reported(m, f"programs.decode.calls[{i}] (op linear) arg 0", "view [64, 2112) of buffer 'd_h' is outside")


def test_8_view_offset_unaligned_on_cuda(m):
    m["target"] = {"device": "cuda", "arch": "sm_90a"}
    i = call_index(m, "decode", "linear")
    m["programs"]["decode"]["calls"][i]["args"][0] = {"buf": "d_h", "offset": 1, "shape": [1]}
    reported(m, f"programs.decode.calls[{i}] (op linear) arg 0", "offset 1 of buffer 'd_h' is not 16-byte aligned")


# 9. programs: no read before write, no writes to inputs or weights, outputs written, a batch

def test_9_read_before_write(m):
    m["programs"]["decode"]["calls"].pop(0)  # drop the embedding: the first norm reads d_x unwritten
    reported(m, "programs.decode.calls[0] (op rms_norm)", "reads workspace buffer 'd_x' before anything")


def test_9_write_to_a_weight(m):
    i = call_index(m, "decode", "linear")
    m["programs"]["decode"]["calls"][i]["args"][2] = {"buf": "lm_head"}
    reported(m, f"programs.decode.calls[{i}] (op linear) arg 2", "writes to weight buffer 'lm_head'")


def test_9_write_to_an_input(m):
    m["buffers"]["d_x"]["kind"] = "input"  # the embedding call now writes what the caller wrote
    reported(m, "programs.decode.calls[0] (op embed) arg 2", "writes to input buffer 'd_x'")


def test_9_output_never_written(m):
    i = call_index(m, "decode", "sample")
    m["programs"]["decode"]["calls"].pop(i)
    reported(m, "buffers.d_next", "output buffer is never written by any program")


def test_9_no_program_steps_a_batch(m):
    for p in m["programs"].values():
        p.pop("batch", None)
    reported(m, "programs", "no program steps a batch")


def test_9_two_buffers_in_one_role(m):
    m["buffers"]["d_next2"] = dict(m["buffers"]["d_next"])
    m["programs"]["decode"]["calls"].append({"op": "sample", "args": [{"buf": "d_logits"}, {"buf": "d_temperature"},
                                                                      {"buf": "d_rng"}, {"buf": "d_mask"},
                                                                      {"buf": "d_mask_row"}, {"buf": "d_next2"}]})
    n = len(m["programs"]["decode"]["calls"]) - 1
    reported(m, f"programs.decode.calls[{n}] (op sample)", "already has 'd_next' in that role")


def test_9_once_program_steps_no_batch(m):
    m["programs"]["rope_init"]["batch"] = {"groups": 1, "rows": 1}
    reported(m, "programs.rope_init", "a once program runs at load and steps no batch")


def test_9_batch_reach_names_a_var(m):
    m["programs"]["decode"]["batch"]["reach"] = "span"
    reported(m, "programs.decode.batch.reach", "names no var: 'span'")


def test_9_batch_keys_names_a_var_and_needs_the_roles_it_counts_from(m):
    m["programs"]["prefill"]["batch"]["keys"] = "span"
    reported(m, "programs.prefill.batch.keys", "names no var: 'span'")
    # the tiny llama's prefill has cu_seqlens and position but no prompt_len input
    m["vars"]["span"] = {"max": 64}
    reported(m, "programs.prefill.batch.keys", "needs inputs of roles cu_seqlens, position and prompt_len "
                                                  "(missing: prompt_len)")


# 10. nothing declared and unused; topology and peer rules hold -----------------------------

def test_10_unused_buffer(m):
    m["buffers"]["spare"] = {"kind": "workspace", "dtype": "f32", "shape": ["hidden"]}
    reported(m, "buffers.spare", "declared and unused")


def test_10_unused_op(m):
    m["ops"]["spare"] = m["ops"]["linear"]
    reported(m, "ops.spare", "declared and unused")


def test_10_unused_var(m):
    m["vars"]["spare"] = {"max": 8}
    reported(m, "vars.spare", "declared and unused")


def test_10_unused_state(m):
    m["states"]["spare"] = {"bytes_per_seq": 64}
    reported(m, "states.spare", "declared and unused")


def test_10_topology_does_not_partition_the_ranks(m):
    m["topology"] = {"ranks": 2, "rank": 0, "groups": {"tp": [[0]]}}
    reported(m, "topology.groups.tp", "must place every rank 0..1 exactly once: 1 placed, the topology has 2")


def test_10_rank_outside_the_topology(m):
    m["topology"] = {"ranks": 2, "rank": 2}
    reported(m, "topology.rank", "must lie in [0, 2)")


def test_10_peer_buffer_needs_several_ranks(m):
    m["buffers"]["d_x_peer"] = {"kind": "peer", "dtype": "f32", "shape": ["seqs", "hidden"], "of": "d_x"}
    reported(m, "buffers.d_x_peer", "peer buffers need a topology of 2 or more ranks")


def test_10_peer_buffer_mirrors_an_existing_buffer(m):
    m["topology"] = {"ranks": 2, "rank": 0, "groups": {"tp": [[0, 1]]}}
    m["buffers"]["d_x_peer"] = {"kind": "peer", "dtype": "f32", "shape": ["seqs", "hidden"], "of": "d_y"}
    reported(m, "buffers.d_x_peer.of", "no buffer named 'd_y'")


def test_10_peer_buffer_mirrors_device_memory_calls_write(m):
    m["topology"] = {"ranks": 2, "rank": 0, "groups": {"tp": [[0, 1]]}}
    m["buffers"]["w_peer"] = {"kind": "peer", "dtype": "f32", "shape": ["hidden"], "of": "final_norm"}
    reported(m, "buffers.w_peer.of", "buffer 'final_norm' is weight")
