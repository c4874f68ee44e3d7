"""The core: the vocabularies every layer shares, with numpy only (never torch, never the runtime).

- the spec and its rate calculus: :mod:`cis.core.spec`, :mod:`cis.core.topologies`, :mod:`cis.core.rates`;
- the exit policy: :mod:`cis.core.policy` (the one exit decision, confidence, patience, the transfer cap);
- the bundle and its stages: :mod:`cis.core.bundle`, :mod:`cis.core.signing`, :mod:`cis.core.stages`;
- what a service measures: :mod:`cis.core.measurement` (counts), :mod:`cis.core.records` (latency summaries,
  request records); link faults: :mod:`cis.core.faults`;
- errors, logs, optional extras, references to user code, input files: :mod:`cis.core.errors`,
  :mod:`cis.core.logs`, :mod:`cis.core.extras`, :mod:`cis.core.user_code`, :mod:`cis.core.input_files`,
  :mod:`cis.core.png`.
"""
