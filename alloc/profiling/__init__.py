"""A corpus profiled for the allocator: its statistics (mutual information, spectra,
attention patterns), the pilot's typed request and result, the profile file and the flags the
two profile commands share. No torch: ``workers.profile`` runs the pilot."""
