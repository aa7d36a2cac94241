"""The end of a run: tables, compare.pl's report, user report, md5 cache, mail."""
