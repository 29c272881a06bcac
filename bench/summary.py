"""One line per result of bench/decode.py's JSON output, for the device scripts' logs.

    python3 bench/decode.py ... > LOG; python3 bench/summary.py LABEL < LOG
"""
import json
import sys


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    for line in sys.stdin:
        if not line.startswith('{"') or line.startswith('{"gpu"'):
            continue
        d = json.loads(line)
        if "prefill_tokens" in d:
            print(label, "prefill", d["shape"], d["kern_prefill_ms"], "ms; sdpa", d["hf_sdpa_forward_ms"])
        else:
            print(label, "decode", d["shape"], d["batch"], d["kern_decode_tok_s"], "tok/s", d["kern_step_ms"],
                  "ms; eager", d["hf_eager_decode_tok_s"])


if __name__ == "__main__":
    main()
