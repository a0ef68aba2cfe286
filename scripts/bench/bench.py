#!/usr/bin/env python3
"""`make bench`: mha's attention speed beside its peers, measured in the same run.

Runs `mha bench` (forward/backward GFLOP/s, fraction of this machine's sgemm rate, extra memory,
module forward) and then, when the pip packages are installed, the same shapes with PyTorch's
scaled_dot_product_attention (forward and backward) and nn.MultiheadAttention, and ONNX Runtime's
com.microsoft MultiHeadAttention (forward). Repeats the whole set BENCH_ROUNDS times (default 3),
prints one table of the medians and writes build/bench/bench.json (medians and every round).
Peers use the same thread count as mha (OMP_NUM_THREADS, default: all cores) and their fastest
inference mode (torch.inference_mode; ORT with all graph optimisations).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_arguments(usage, flags=("--quick",), needs_cli=True):
    """(build dir, the flags given) of a bench script's command line `[build dir] [flags]`: --help
    prints `usage` and exits; an unknown flag or a second folder is an error (exit 2), not a full run;
    so is a build dir without the CLI where the script runs it (`needs_cli`)."""
    given = sys.argv[1:]
    if "--help" in given or "-h" in given:
        print(usage)
        sys.exit(0)
    unknown = [a for a in given if a.startswith("-") and a not in flags]
    folders = [a for a in given if not a.startswith("-")]
    if unknown or len(folders) > 1:
        print(f"{os.path.basename(sys.argv[0])}: unexpected {' '.join(unknown + folders[1:])}\n{usage}", file=sys.stderr)
        sys.exit(2)
    build = folders[0] if folders else os.path.join(ROOT, "build")
    if needs_cli and not os.path.isfile(os.path.join(build, "tools", "mha", "mha")):
        print(f"{os.path.basename(sys.argv[0])}: {build!r} holds no build (tools/mha/mha): run `make build` "
              f"first, or give the build folder", file=sys.stderr)
        sys.exit(2)
    return build, {a for a in given if a in flags}


def median_seconds(run, repeats):
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_json(path, report):
    """The report as JSON at path, atomically (a temporary file, then a rename), its folder made
    if missing."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=2)
    os.replace(path + ".tmp", path)


def torch_peers(shapes, module, threads, repeats):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    out = {}
    for s in shapes:
        B, H, L, d, causal = s["batch"], s["heads"], s["len"], s["head_dim"], s["causal"]
        reps = 1 if L > 8192 else repeats
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(B, H, L, d, generator=g) for _ in range(4))
        with torch.inference_mode():
            fwd = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        bwd = median_seconds(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True), reps)
        out[key(s)] = {"sdpa_forward_ms": fwd * 1e3, "sdpa_backward_ms": bwd * 1e3}
    m = torch.nn.MultiheadAttention(module["embed_dim"], module["num_heads"], batch_first=True).eval()
    x = torch.randn(module["batch"], module["len"], module["embed_dim"])
    with torch.inference_mode():
        t = median_seconds(lambda: m(x, x, x, need_weights=False), repeats)
    return out, {"nn_multihead_attention_forward_ms": t * 1e3, "torch_version": torch.__version__}


def ort_peers(shapes, threads, repeats):
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    out = {}
    for s in shapes:
        B, H, L, d, causal = s["batch"], s["heads"], s["len"], s["head_dim"], s["causal"]
        if causal:
            continue  # MultiHeadAttention has no causal flag in every ORT version; compared non-causal only
        reps = 1 if L > 8192 else repeats
        node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=H)
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, L, H * d]) for n in "qkv"]
        graph = helper.make_graph([node], "mha", io, [helper.make_tensor_value_info("o", TensorProto.FLOAT, [B, L, H * d])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                                  ir_version=9)  # an IR version every recent ORT reads
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {n: rng.standard_normal((B, L, H * d), dtype=np.float32) for n in "qkv"}
        out[key(s)] = {"ort_forward_ms": median_seconds(lambda: sess.run(None, feeds), reps) * 1e3}
    return out, {"onnxruntime_version": ort.__version__}


def write_safetensors(path, tensors):
    """A minimal safetensors writer for the bench's inputs (float32 numpy arrays), so the bench
    needs no safetensors package: header size, JSON header, the arrays' bytes in order."""
    import numpy as np
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())
    os.replace(path + ".tmp", path)


def blackbox(build, module, threads, repeats):
    """The black-box path: `mha attention` file to file (process start, read, forward, write) on
    the module shape with query, key and value given, beside nn.MultiheadAttention's forward
    in-process on the same tensors (need_weights=False, eval, inference mode)."""
    import numpy as np
    N, L, E, H = module["batch"], module["len"], module["embed_dim"], module["num_heads"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((N, L, E), dtype=np.float32) for _ in range(3))
    folder = os.path.join(build, "bench")
    inputs, output = os.path.join(folder, "blackbox_inputs.safetensors"), os.path.join(folder, "blackbox_output.safetensors")
    write_safetensors(inputs, {"query": q, "key": k, "value": v})
    command = [os.path.join(build, "tools", "mha", "mha"), "attention", "--embed-dim", str(E), "--num-heads", str(H),
               "--batch-first", "--no-need-weights", "--inputs", inputs, "--output", output, "--timings"]
    stages = []

    def run_cli():
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        stages.append(done.stderr.strip())
    out = {"mha_cli_file_to_file_ms": median_seconds(run_cli, repeats) * 1e3, "mha_cli_stages": stages[-1]}
    # The forward stage inside the CLI is the module alone, on the same tensors as PyTorch's.
    forward = [float(re.search(r"forward ([0-9.]+) ms", s).group(1)) for s in stages[1:]]
    out["mha_cli_forward_stage_ms"] = statistics.median(forward)
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(threads)
    m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    with torch.inference_mode():
        out["torch_module_in_process_ms"] = median_seconds(lambda: m(tq, tk, tv, need_weights=False), repeats) * 1e3
    return out


def key(s):
    return f'{s["batch"]},{s["heads"]},{s["len"]},{s["head_dim"]},{int(s["causal"])}'


def flops(s):
    f = 4.0 * s["batch"] * s["heads"] * s["len"] ** 2 * s["head_dim"]
    return f / 2 if s["causal"] else f


def median_of_rounds(rounds):
    """The median over the rounds of each measurement (keys *_ms, *_bytes, *_gflops)."""
    keys = {k for r in rounds for k in r if k.endswith(("_ms", "_bytes", "_gflops"))}
    return {k: statistics.median(r[k] for r in rounds if k in r) for k in keys}


def main():
    build, flags = script_arguments("usage: bench.py [build dir] [--quick]   (--quick: mha bench's two small "
                                    "shapes; BENCH_ROUNDS=n rounds, default 3)")
    quick = sorted(flags)
    rounds = os.environ.get("BENCH_ROUNDS", "3")
    if not rounds.isdigit() or int(rounds) < 1:
        sys.exit(f"bench.py: BENCH_ROUNDS: expected a number of rounds >= 1, got {rounds!r}")
    rounds = int(rounds)
    os.makedirs(os.path.join(build, "bench"), exist_ok=True)
    mha_json = os.path.join(build, "bench", "mha.json")
    # Whole rounds (mha, then each peer) repeated: a burst of load from elsewhere on a shared
    # machine spoils one round's figures, not the medians over rounds.
    mha_rounds, peer_rounds, versions = [], [], {}
    for r in range(rounds):
        print(f"\n--- round {r + 1} of {rounds} ---", flush=True)
        subprocess.run([os.path.join(build, "tools", "mha", "mha"), "bench", "--json", mha_json] + quick, check=True)
        with open(mha_json) as f:
            mha_rounds.append(json.load(f))
        threads, shapes, module = (mha_rounds[0][k] for k in ("threads", "attention", "module"))
        peers = {}
        for name, fn in (("torch", lambda: torch_peers(shapes, module, threads, 5)),
                         ("onnxruntime", lambda: ort_peers(shapes, threads, 5))):
            try:
                per_shape, ver = fn()
            except ImportError as e:
                if r == 0:
                    print(f"\n{name} not installed ({e}); skipped. pip install {name} to compare.")
                continue
            for k, v in ver.items():
                versions.setdefault(k, []).append(v)
            for k, v in per_shape.items():
                peers.setdefault(k, {}).update(v)
        try:
            peers["blackbox"] = blackbox(build, module, threads, 5)
        except ImportError as e:  # numpy, for the input file
            if r == 0:
                print(f"\nblack-box bench skipped ({e}); pip install numpy torch to run it.")
        peer_rounds.append(peers)

    report = dict(mha_rounds[0])
    report["rounds"] = rounds
    report["sgemm_gflops"] = statistics.median(m["sgemm_gflops"] for m in mha_rounds)
    report["attention"] = [dict(s, **median_of_rounds([m["attention"][i] for m in mha_rounds]))
                           for i, s in enumerate(report["attention"])]
    for s in report["attention"]:
        s["forward_gflops"] = flops(s) / s["forward_ms"] / 1e6
        s["backward_gflops"] = 2.5 * flops(s) / s["backward_ms"] / 1e6
    report["module"] = dict(report["module"], **median_of_rounds([m["module"] for m in mha_rounds]))
    peers = {k: median_of_rounds([p[k] for p in peer_rounds if k in p]) for k in peer_rounds[0]}
    versions = {k: (statistics.median(v) if isinstance(v[0], float) else v[0]) for k, v in versions.items()}
    report["peers"], report["peer_versions"], report["rounds_raw"] = peers, versions, {"mha": mha_rounds,
                                                                                      "peers": peer_rounds}
    shapes, module, sgemm = report["attention"], report["module"], report["sgemm_gflops"]

    print(f"\nMedians over {rounds} rounds, {report['threads']} threads; sgemm {sgemm:.1f} GFLOP/s. "
          "ratio = peer time / mha time (> 1: mha is faster)")
    print(f'{"shape (B, H, L=S, d)":28s} {"mha fwd":>8s} {"GFLOP/s":>8s} {"%sgemm":>6s} {"sdpa":>8s} {"ratio":>6s}'
          f' {"ort":>8s} {"ratio":>6s} {"mha bwd":>8s} {"GFLOP/s":>8s} {"%sgemm":>6s} {"sdpa":>8s} {"ratio":>6s}'
          f' {"MiB":>6s}')
    for s in shapes:
        p = peers.get(key(s), {})
        name = f'({s["batch"]}, {s["heads"]}, {s["len"]}, {s["head_dim"]}){" causal" if s["causal"] else ""}'

        def cell(peer, mine):
            return (f"{peer:8.1f} {peer / mine:6.2f}") if peer else f'{"-":>8s} {"-":>6s}'
        extra = max(s["forward_extra_bytes"], s["backward_extra_bytes"]) / 2**20
        print(f'{name:28s} {s["forward_ms"]:8.1f} {s["forward_gflops"]:8.1f} {100 * s["forward_gflops"] / sgemm:5.0f}% '
              f'{cell(p.get("sdpa_forward_ms"), s["forward_ms"])} {cell(p.get("ort_forward_ms"), s["forward_ms"])} '
              f'{s["backward_ms"]:8.1f} {s["backward_gflops"]:8.1f} {100 * s["backward_gflops"] / sgemm:5.0f}% '
              f'{cell(p.get("sdpa_backward_ms"), s["backward_ms"])} {extra:6.1f}')
    print("(times in ms; MiB: the larger of forward's and backward's peak memory beyond inputs and outputs)")
    if "nn_multihead_attention_forward_ms" in versions:
        t = versions["nn_multihead_attention_forward_ms"]
        print(f'\nModule forward (N={module["batch"]}, L={module["len"]}, E=512, 8 heads): mha {module["forward_ms"]:.1f} ms, '
              f'nn.MultiheadAttention {t:.1f} ms, ratio {t / module["forward_ms"]:.2f}')
    box = peers.get("blackbox", {})
    if "mha_cli_file_to_file_ms" in box:
        cli, line = box["mha_cli_file_to_file_ms"], ""
        if "torch_module_in_process_ms" in box:
            t = box["torch_module_in_process_ms"]
            f = box["mha_cli_forward_stage_ms"]
            line = (f", nn.MultiheadAttention in-process {t:.1f} ms, ratio {t / cli:.2f}; "
                    f"the module alone (the CLI's forward stage) {f:.1f} ms, ratio {t / f:.2f}")
        stages = [p["blackbox"]["mha_cli_stages"] for p in peer_rounds if "blackbox" in p]
        print(f'\nBlack box (N={module["batch"]}, L={module["len"]}, E={module["embed_dim"]}, {module["num_heads"]} heads; '
              f'query, key, value): `mha attention` file to file {cli:.1f} ms{line}\n  last run: {stages[-1]}')
    path = os.path.join(build, "bench", "bench.json")
    write_json(path, report)
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
