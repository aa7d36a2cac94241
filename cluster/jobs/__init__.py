"""build.pl's port: test discovery (corpus), job command strings (commands), job generation
(generate) and the jobs of bmpcmp runs (bmpcmp)."""
