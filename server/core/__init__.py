"""The transport-neutral application core: model lookup, segmentation, planning,
queueing one work item per piece, joining n-best lists, streaming. Plain dataclasses
in and out; no protobuf, no HTTP."""
