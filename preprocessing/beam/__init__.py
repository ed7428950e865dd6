"""The Apache Beam pipelines: conversion engine (the run, counting and progress, publishing, local workers), CT and image pipelines."""
