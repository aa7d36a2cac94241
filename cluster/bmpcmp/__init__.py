"""bmpcmp: PNM/PNG images, page differences and the HTML page (a leaf tool)."""
