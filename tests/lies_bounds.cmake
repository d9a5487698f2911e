# issue 32 (bounds): tests registered here.
