"""One line per result of bench/decode.py's JSON output (bench/gpu.py prints them as its summary).

    python3 bench/decode.py ... > LOG; python3 bench/summary.py LABEL < LOG
"""
import json
import sys


def lines(log, label: str = "") -> list[str]:
    out = []
    for line in log:
        if not line.startswith('{"') or line.startswith('{"gpu"'):
            continue
        d = json.loads(line)
        if "prefill_tokens" in d:
            out.append(f"{label} prefill {d['shape']} {d['kern_prefill_ms']} ms; sdpa {d['hf_sdpa_forward_ms']}")
        else:
            out.append(f"{label} decode {d['shape']} {d['batch']} {d['kern_decode_tok_s']} tok/s {d['kern_step_ms']} "
                       f"ms; eager {d['hf_eager_decode_tok_s']}")
    return out


def main() -> None:
    print("\n".join(lines(sys.stdin, sys.argv[1] if len(sys.argv) > 1 else "")))


if __name__ == "__main__":
    main()
