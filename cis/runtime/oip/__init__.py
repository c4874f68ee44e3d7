"""The front doors of a node: the Open Inference Protocol (KServe v2) over HTTP and gRPC.

Thin adapters onto the node's normal path (:mod:`~cis.runtime.oip.door`): a request from any door is
admitted, batched, decided, forwarded and counted as a ZeroMQ request is. :mod:`~cis.runtime.oip.codec`
encodes and decodes the protocol's messages (pure; with :mod:`~cis.runtime.oip.errors` and
:mod:`~cis.runtime.oip.tensors`), :mod:`~cis.runtime.oip.triton` gives Triton's configuration and statistics
forms; :mod:`~cis.runtime.oip.http_door` (with :mod:`~cis.runtime.oip.http_connection` and
:mod:`~cis.runtime.oip.http_requests`) and :mod:`~cis.runtime.oip.grpc_door` (with
:mod:`~cis.runtime.oip.grpc_messages`) speak it, within the limits of docs/runtime.md, *Limits of the front
door*. Their libraries are imported lazily, behind the 'http' and 'grpc' extras.
"""
