# issue 32 (loader): tests registered here.
