"""`iotune raid`: plan-then-apply mdadm volumes, safe by construction."""
