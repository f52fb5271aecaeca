"""benchmarks/diagnose_ssmax_compile.py on CPU (aot_eager, the isolated part): every candidate process runs
the form it names (log(n_i + 1) rows, theta function, attention route read back from the patched
package) and its compiled gradients agree with eager there, so the script's table reads "right"."""

from conftest import load_benchmark


def test_diagnose_ssmax_compile_on_cpu(capsys):
    module = load_benchmark("diagnose_ssmax_compile")
    table, forms = module.main(["--device", "cpu", "--backend", "aot_eager", "--parts", "isolated",
                                "--candidates", "product", "broadcast", "matmul", "kernel"])
    assert "running on the CPU" in capsys.readouterr().out
    assert table[0] == ["candidate", "verdict", "isolated"]
    assert [(row[0], row[1]) for row in table[1:]] == [
        ("product", "right"), ("broadcast", "right"), ("matmul", "right"), ("kernel", "right")]
    assert forms == {"product": "log_n rows 3, theta package, sdpa",
                     "broadcast": "log_n rows 1, theta package, sdpa",
                     "matmul": "log_n rows 3, theta patched, sdpa",
                     "kernel": "log_n rows 1, theta package, kernel"}
