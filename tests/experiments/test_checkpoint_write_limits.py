"""A checkpoint write that hits the file-size limit fails safely (no partial file, no temporary left) and its
error names the checkpoint and the cause in words, not torch's internal ``enforce fail`` text. In a subprocess
(the limit applies to the whole process)."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    from pathlib import Path
    from omegaconf import OmegaConf
    from experiments.run_files import LoopState, save_checkpoint
    d = Path(sys.argv[1])
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        save_checkpoint(d / "checkpoint.pt", model, opt, None, LoopState(), OmegaConf.create({"seed": 0}))
        print("WROTE")
    except OSError as e:
        print("ERROR", e)
    print("FILES", sorted(p.name for p in d.iterdir()))
""")


def test_a_checkpoint_past_the_file_size_limit_names_the_file_and_the_cause(tmp_path):
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=180,
                       cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    out = p.stdout
    want = f"ERROR could not write the checkpoint {tmp_path / 'checkpoint.pt'}: the process's file-size limit"
    assert want in out and "enforce fail" not in out, out + p.stderr[-2000:]
    assert "FILES []" in out, out
