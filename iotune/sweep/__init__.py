"""`iotune sweep-aio` and `iotune sweep-threads`."""
