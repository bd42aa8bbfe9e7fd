"""`machine`: the instruction sets a speed figure names, read from the
environment each library reads them from."""

from mha_jax.measure import machine


def test_the_limits_come_from_the_flags_each_library_reads(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1 --xla_cpu_max_isa=AVX2")
  monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
  isa = machine.instruction_sets()
  assert isa["xla_max_isa"] == "AVX2" and isa["aten_cpu_capability"] == "avx2"
  monkeypatch.delenv("XLA_FLAGS")
  monkeypatch.delenv("ATEN_CPU_CAPABILITY")
  isa = machine.instruction_sets()
  assert isa["xla_max_isa"] is None and isa["aten_cpu_capability"] is None


def test_the_description_names_the_cpu_and_the_limits():
  isa = {"model": "AMD EPYC", "avx512f": True, "avx2": True, "family": "25",
         "model_number": "17", "xla_max_isa": "AVX2",
         "aten_cpu_capability": "avx2"}
  assert machine.describe(isa) == ("AMD EPYC (family 25 model 17), AVX-512; "
                                   "XLA limited to AVX2, torch limited to "
                                   "avx2")
  isa.update(avx512f=False, xla_max_isa=None, aten_cpu_capability=None,
             family=None, model="")
  assert machine.describe(isa) == "unknown CPU, AVX2"
