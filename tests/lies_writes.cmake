# issue 32 (writes): tests registered here.
