"""The management API for tenants: `auth` (plumbing DRF settings name) and `views`."""
