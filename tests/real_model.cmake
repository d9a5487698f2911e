# (tests added by the real-weights work; see the file's first test for what it checks)
