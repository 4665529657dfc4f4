"""Key bytes: key groups (Murmur3, ranges, placement), the grouping-key encoding, the
RocksDB key layout of each state kind, value codecs, and the native kernels behind them."""
