"""The formats of the files in the master home and in a run's folder: the end record, the
results journal, abort and stop requests, groups, the audit trail, node records, locks.
The console and the command lines read these; every room of the master stands on them."""
