# issue 32 (gate): tests registered here.
