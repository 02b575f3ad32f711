mod is_quorum;
