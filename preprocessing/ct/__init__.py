"""CT and MR volumes: discovery, DICOM series and labels, reading, geometry and intensity transforms."""
