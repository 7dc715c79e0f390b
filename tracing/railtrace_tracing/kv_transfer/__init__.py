"""KV-transfer shim: the `llm_d.kv_transfer` span for NIXL (and for anything else via the recorder)."""

from railtrace_tracing.kv_transfer.instrumentor import (
    NixlKVTransferInstrumentor,
    TransferScope,
    kv_transfer_scope,
)
from railtrace_tracing.kv_transfer.recorder import (
    KVTransferRecord,
    current_kv_transfer,
    emit_kv_transfer,
    evidence_attributes,
    kv_attributes,
    record_kv_transfer,
    start_kv_transfer,
)
from railtrace_tracing.kv_transfer.ucx_capture import UcxLogCapture

__all__ = [
    "KVTransferRecord",
    "NixlKVTransferInstrumentor",
    "TransferScope",
    "UcxLogCapture",
    "current_kv_transfer",
    "emit_kv_transfer",
    "evidence_attributes",
    "kv_attributes",
    "kv_transfer_scope",
    "record_kv_transfer",
    "start_kv_transfer",
]
