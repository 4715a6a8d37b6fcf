"""`tpsim estimate` from the command line: defaults, JSON, every bad input -> one line and exit status 2."""

import json
import subprocess
import sys

import pytest

from tpsim.cli import main


def run(args):
    return subprocess.run([sys.executable, "-m", "tpsim.cli", *args], capture_output=True, text=True, timeout=120)


def test_defaults_gpt3_175b_on_1024_a100(capsys):
    assert main(["estimate"]) == 0
    out = capsys.readouterr().out
    assert "gpt3-175b" in out and "1024 x A100-SXM4-80GB" in out and "tp8 pp16 dp8 sp" in out


def test_json_object(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2",
                 "--global-batch", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["dp"] == 8 and d["cluster"]["device"] == "H100-SXM" and d["compute_model"] == "kernel:cudnn"
    assert 0 < d["mfu"] < 1


def test_hf_config_and_overrides(tmp_path, capsys):
    cfg = {"model_type": "mistral", "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
           "num_key_value_heads": 4, "intermediate_size": 3584, "vocab_size": 32000,
           "max_position_embeddings": 32768, "sliding_window": None}  # absent = transformers' 4096 window
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(path), "--cluster", "hgx-h200", "--gpus", "8", "--tp", "2",
                 "--layers", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["global_batch"] == 4  # dp x micro-batch when nothing else is known


@pytest.mark.parametrize("args,needle", [
    (["--tp", "16", "--model", "llama3-70b", "--heads", "40", "--hidden", "5120", "--cluster", "dgx-h100",
      "--gpus", "64"], "tp=16 does not divide num_attention_heads=40"),
    (["--model", "nonexistent-model"], "model='nonexistent-model' is not a preset"),
    (["--cluster", "dgx-a100", "--gpus", "12"], "gpus=12 is not a whole number of nodes"),
    (["--global-batch", "100"], "global batch 100 is not a multiple of micro-batch 1 x dp 8"),
    (["--tp", "0"], "argument --tp: 0 must be a positive integer"),
    (["--recompute", "partial"], "argument --recompute: invalid choice"),
    (["--model", "/nonexistent/config.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_status_2(args, needle):
    res = run(["estimate", *args])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_malformed_cluster_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnode: [unclosed\n")
    res = run(["estimate", "--cluster", str(bad), "--gpus", "8"])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "bad.yaml" in res.stderr
