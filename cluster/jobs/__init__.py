"""build.pl's port: test discovery, job command strings, job generation."""
