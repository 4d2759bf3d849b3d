"""An API-faithful simulator of pyACL and the tdt queue C API (DESIGN.md §4).

It lets the ACL backend run unchanged on machines without an NPU: a simulated ``acl`` module
(``rt``, ``mdl``, ``op``, ``util`` with pyACL's calling conventions), a simulated
``libacl_tdt_queue.so`` and ``libascendcl.so`` for ctypes, executing ONNX models with
onnxruntime as ATC would have built them (see :mod:`~streamer.runtime.acl.sim.manifest`). Every
rule of reference/pyacl.md §9 is enforced with its documented error code; the module that
enforces each rule says which in its docstring:

================  ======================================================================
S1-S5             :mod:`.binding` (conventions), :mod:`.memory` (``bytes_to_ptr``)
S6-S9             :mod:`.memory`, :mod:`.models` (data buffers)
S10               :mod:`.devices`
S11, S13-S16      :mod:`.models`
S12, S19-S21      :mod:`.streams`
S17, S18          :mod:`.simulator`, :mod:`.queues`
S22               :mod:`.threads`
S23-S29           :mod:`.queues`, :mod:`.api_tdt`
teardown          :mod:`.teardown` (release order: stream → context → device → finalize,
                  model resources and tdt queues first, callbacks unsubscribed first)
O1-O7             :mod:`.single_ops`, :mod:`.op_handles`, :mod:`.op_kernels` (single
                  operators: ``acl.op.infer_shape`` / ``execute_v2``, tensor descriptions)
AIPP              :mod:`.aipp_sets` (``create_aipp``, ``set_aipp_*``), :mod:`.aipp_model`
                  (``set_input_aipp``, execution), :mod:`.aipp_data` (the AIPP input)
================  ======================================================================

Module map: :mod:`.simulator` assembles one machine; ``api_*`` are the public surfaces;
:mod:`.image` / :mod:`.manifest` the simulated offline models; :mod:`.faults` the injected
failures; :mod:`.calllog` the call log; :mod:`.backend` the ``acl-sim`` backend.
"""

from __future__ import annotations

from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["Simulator"]
