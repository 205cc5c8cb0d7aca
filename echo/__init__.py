"""echo: the built-in demo provider. It answers chat, messages, embeddings, responses, files,
batches and videos in-process with usage that costs a known amount, so capcheck and the tests
can prove the cap without a real provider."""
