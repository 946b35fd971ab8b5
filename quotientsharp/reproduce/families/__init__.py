"""The transformer families: ViT and BERT from scratch (:mod:`.vit`, :mod:`.bert`), the
fine-tunes of a ViT (:mod:`.vit_finetune`) and of the real MiniLM (:mod:`.minilm`).

Each study trains its family (:mod:`.training`, :mod:`.pretrained`) and measures it with the
shared driver (:mod:`.run`); :mod:`.report` writes the page.
"""
