"""Video analysis building blocks: capture, sampling, detection, drawing, JPEG and MP4 I/O.

Stages live in streamkit/stages/ (video_capture, sampler, detect, describe, annotate); this
package holds the logic they call, importable without an event loop (and used directly by the server, the offline runner and the bench).
Heavy libraries (cv2, onnxruntime, av) are imported inside the modules that need them.
"""
