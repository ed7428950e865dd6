"""`fullres predict`: whole scans through the trained model, masks in each scan's own geometry, DICOM SEG."""
