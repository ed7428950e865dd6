"""Video: files and DAVIS / YouTube-VOS frame folders into clips, and the synthetic motion demo."""
