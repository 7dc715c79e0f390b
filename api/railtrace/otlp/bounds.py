"""Every bound the OTLP codec puts on what one sender may make the service hold or do.

One module so that the decoder, the row builder, the stored-span reader and the C accelerators
(`_spandecode.c` reports its own copy as `BOUNDS`, and is used only while it equals
`SPAN_READER_BOUNDS`) cannot drift apart. Body sizes and timeouts are configuration
(`railtrace.settings`), not bounds of the codec.
"""

from __future__ import annotations

# -- One span's attributes: a hostile span must not cost more than it is worth ----------------
MAX_ATTR_VALUE_CHARS = 8192
MAX_ARRAY_ITEMS = 1024
MAX_DEPTH = 8
MAX_ATTRIBUTES = 256
MAX_EVENTS = 128
MAX_NAME = 512  # span name
MAX_EVENT_NAME = 256
MAX_STATUS_MESSAGE = 1024
MAX_KEY = 256  # a request id kept as a join key
MAX_SCOPE_NAME = 256
MAX_SERVICE_NAME = 256

# -- Time: anything outside [2000-01-01, 2200-01-01) is a broken clock or a hostile sender -----
MIN_TIME_NS = 946_684_800 * 10**9
MAX_TIME_NS = 7_258_118_400 * 10**9

# -- Compressed bodies -------------------------------------------------------------------------
# A gzip body may hold several members (RFC 1952); exporters send one. More than this is refused.
MAX_GZIP_MEMBERS = 64
# Compressed bytes handed to zlib at a time. zlib copies the input left after a member ends
# (`unused_data`), so this bounds the copy per member: the work is at most the body plus
# MAX_GZIP_MEMBERS x INFLATE_STEP, whatever the member structure.
INFLATE_STEP = 64 * 1024

# The bounds the C span reader applies, by the names it reports them under.
SPAN_READER_BOUNDS = {
    "MAX_ATTR_VALUE_CHARS": MAX_ATTR_VALUE_CHARS,
    "MAX_ARRAY_ITEMS": MAX_ARRAY_ITEMS,
    "MAX_DEPTH": MAX_DEPTH,
    "MAX_ATTRIBUTES": MAX_ATTRIBUTES,
    "MAX_EVENTS": MAX_EVENTS,
    "MAX_NAME": MAX_NAME,
    "MAX_STATUS_MESSAGE": MAX_STATUS_MESSAGE,
    "MAX_EVENT_NAME": MAX_EVENT_NAME,
}
