"""Memory: attention-backend cache layouts and paged requests in block tables
[LAYOUT, PAGED]."""
