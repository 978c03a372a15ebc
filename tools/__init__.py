"""(filled in by the work of its issue)"""
