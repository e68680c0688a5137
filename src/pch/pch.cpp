// Anchor translation unit for the shared precompiled header (src/pch/mmsp_pch.h).
